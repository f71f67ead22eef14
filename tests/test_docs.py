"""The documentation: its generated pages cover the code, the site builds with warnings as errors,
and every Python example of ``docs/*.md`` and ``README.md`` runs.

The generated pages (``docs/hooks.py``) are checked directly and fast; building the site (about
20 s) and running the examples (each file in a fresh process, each block in a fresh namespace)
are marked slow, so they run in CI (``pytest --slow``), not in a developer's default run.
"""

from __future__ import annotations

import html
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.main import get_command

from attnflow.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXAMPLE_FILES = sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
# a reference outside the repository: the docs must stand alone
OUTSIDE_REFERENCE = re.compile(r"SPEC|shared/|\.\./shared")


def _load_hooks():
    spec = importlib.util.spec_from_file_location("attnflow_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _load_hooks()


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "NO_MKDOCS_2_WARNING": "1"}


# --- the generated pages ------------------------------------------------------------------------


def test_config_reference_lists_every_key_with_type_default_and_meaning():
    from attnflow.io.config_schema import SECTIONS

    page = hooks.config_reference()
    rows = {line.split("|")[1].strip(" `"): line for line in page.splitlines() if line.startswith("| `")}
    keys = {f"{s}.{k}" for s, model in SECTIONS.items() for k in model.model_fields}
    assert set(rows) == keys
    for key, row in rows.items():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        assert len(cells) == 5, row
        assert all(cells), f"{key}: an empty cell in {row!r}"
    # no meaning written for a key the schema does not have (a renamed key fails here)
    assert set(hooks.KEY_MEANINGS) <= keys
    assert "| `model.n` | int | `64` | ≥ 2 |" in page
    assert "| `model.beta` | float | `1.0` | > 0 |" in page
    assert '| `solver.method` | "euler" \\| "rk4" \\| "geodesic_rk4" \\| "adaptive" | `"rk4"` |' in page


def test_config_reference_lists_the_rules_between_keys():
    from attnflow.io.config_rules import RULES

    page = hooks.config_reference()
    for rule in RULES:
        assert rule.__name__.strip("_").replace("_", " ") in page


def test_cli_reference_lists_every_visible_command_and_option():
    import typer

    from attnflow.cli import app

    group = typer.main.get_command(app)
    page = hooks.cli_reference()
    commands = [(name, c) for name, c in group.commands.items() if not getattr(c, "commands", None)]
    commands += [  # the commands of a group (``attnflow config show``) have sections of their own
        (f"{name} {sub}", c)
        for name, g in group.commands.items()
        for sub, c in getattr(g, "commands", {}).items()
    ]
    assert any(" " in name for name, _ in commands)  # there is a group
    for name, command in commands:
        if command.hidden:
            continue
        assert f"## `attnflow {name}`" in page
        section = page.split(f"## `attnflow {name}`")[1].split("\n## ")[0]
        assert (command.help or "").strip().splitlines()[0] in section
        for param in command.params:
            if param.hidden or param.name == "help":
                continue
            shown = f"`{param.name.upper()}`" if param.param_type_name == "argument" else f"`{param.opts[0]}`"
            assert shown in section, f"{name}: {shown} missing"
    assert "`--version`" in page


def test_one_page_per_experiment_with_setting_expectations_and_why():
    from attnflow.workflows.experiments import load_experiments

    experiments = load_experiments()
    pages = hooks.experiment_pages()
    assert set(pages) == {f"experiments/{e.id}.md" for e in experiments} | {"experiments/index.md"}
    assert set(hooks.WHY) == {e.id for e in experiments}, "every experiment needs its 'why', and only those"
    for e in experiments:
        page = pages[f"experiments/{e.id}.md"]
        assert page.startswith(f"# {e.id}: {e.title}")
        assert e.setting in page and hooks.WHY[e.id] in page
        table = [line for line in page.splitlines() if line.startswith("| ") and "`" in line]
        for expectation in e.expect:
            assert any(f"`{expectation.metric}`" in line for line in table), (e.id, expectation.text)
        assert f"[{e.id}]({e.id}.md)" in pages["experiments/index.md"]


def test_experiment_page_shows_its_figures_when_present(tmp_path, monkeypatch):
    (tmp_path / "E1_a.png").write_bytes(b"")
    (tmp_path / "E10.png").write_bytes(b"")  # another experiment's figure
    monkeypatch.setattr(hooks, "FIGURES", tmp_path)
    pages = hooks.experiment_pages()
    assert "![E1: E1_a](../figures/E1_a.png)" in pages["experiments/E1.md"]
    assert "E10.png" not in pages["experiments/E1.md"] and "## Figures" not in pages["experiments/E2.md"]


def test_pages_stand_alone():
    generated = hooks.generated_pages()
    written = {p.name: p.read_text(encoding="utf-8") for p in DOCS.rglob("*.md")}
    for name, text in {**generated, **written}.items():
        assert not OUTSIDE_REFERENCE.search(text), f"{name} cites a document outside the repository"


def test_every_example_file_has_python_blocks_where_expected():
    counts = {
        path.name: len(PYTHON_BLOCK.findall(path.read_text(encoding="utf-8"))) for path in EXAMPLE_FILES
    }
    assert counts["README.md"] >= 1 and counts["index.md"] >= 1 and counts["api.md"] >= 5, counts


# --- the site and the examples (slow) -------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built once with ``mkdocs build --strict`` (warnings are errors)."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    site = tmp_path_factory.mktemp("docs") / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return site


@pytest.mark.slow
def test_site_builds_strict(site):
    for page in [
        "index.html",
        "reference/config/index.html",
        "reference/cli/index.html",
        "experiments/E5/index.html",
    ]:
        assert (site / page).is_file(), page
    config_html = (site / "reference/config/index.html").read_text(encoding="utf-8")
    assert "solver.save_every" in config_html
    api_html = (site / "reference/api-core/index.html").read_text(encoding="utf-8")
    assert "make_rope" in api_html and "ToeplitzCos" in api_html  # mkdocstrings rendered the modules


@pytest.mark.slow
def test_rendered_site_stands_alone(site):
    cited = [
        str(p.relative_to(site))
        for p in site.rglob("*.html")
        if OUTSIDE_REFERENCE.search(p.read_text("utf-8"))
    ]
    assert cited == []


# what makes a browser fetch something: scripts, stylesheets, fonts, preconnects, CSS imports
FETCHED_HTML = re.compile(r"<(script|link|img|iframe|source)\b[^>]*\b(src|href)=[\"']([^\"']+)", re.I)
FETCHED_CSS = re.compile(r"(?:@import\s+(?:url\()?|url\()\s*[\"']?([^\"')\s]+)", re.I)
OUTSIDE_URL = re.compile(r"^(https?:)?//", re.I)


def _outside_requests(site: Path) -> list[str]:
    found = []
    for page in site.rglob("*.html"):
        for tag, _, url in FETCHED_HTML.findall(page.read_text(encoding="utf-8")):
            if OUTSIDE_URL.match(url) and not (tag.lower() == "link" and "canonical" in url):
                found.append(f"{page.relative_to(site)}: <{tag}> {url}")
    for sheet in site.rglob("*.css"):
        found += [f"{sheet.relative_to(site)}: {url}" for url in FETCHED_CSS.findall(sheet.read_text("utf-8"))
                  if OUTSIDE_URL.match(url)]  # fmt: skip
    return found


def test_the_request_checker_finds_outside_scripts_styles_and_fonts(tmp_path):
    (tmp_path / "index.html").write_text(
        '<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">'
        '<script src="//cdn.example.org/mathjax.js"></script><a href="https://example.org">a link</a>'
    )
    (tmp_path / "s.css").write_text("@font-face { src: url(https://fonts.gstatic.com/r.woff2) }")
    urls = {f.split(" ")[-1] for f in _outside_requests(tmp_path)}
    assert urls == {  # the plain link to read is not a request
        "https://fonts.googleapis.com/css?family=Roboto",
        "//cdn.example.org/mathjax.js",
        "https://fonts.gstatic.com/r.woff2",
    }


@pytest.mark.slow
def test_the_site_requests_nothing_from_outside_and_renders_its_maths_locally(site):
    assert _outside_requests(site) == []
    mathjax = site / hooks.MATHJAX_PAGE
    assert mathjax.is_file() and mathjax.stat().st_size > 1_000_000  # MathJax itself, not a stub
    model = (site / "model/index.html").read_text(encoding="utf-8")
    assert 'class="arithmatex"' in model  # the formulas are marked for MathJax
    assert "javascripts/mathjax/tex-svg.js" in model and "javascripts/mathjax-config.js" in model


@pytest.mark.slow
def test_the_tutorial_and_every_experiment_page_show_their_results(site):
    from attnflow.workflows.experiments import load_experiments

    # the experiments of the reproduce run whose figures and table the docs hold (an experiment added
    # since shows its results once that run is made again, as the README says)
    table = hooks.MEASURED.read_text(encoding="utf-8")
    shown = [e.id for e in load_experiments() if f"| {e.id} |" in table]
    assert {f"E{k}" for k in range(10)} <= set(shown)
    pages = ["tutorial/index.html"] + [f"experiments/{eid}/index.html" for eid in shown]
    for page in pages:
        text = (site / page).read_text(encoding="utf-8")
        images = re.findall(r'<img[^>]*src="([^"]+)"', text)
        assert images, f"{page} shows no image"
        for src in images:
            assert (site / page).parent.joinpath(src).resolve().is_file(), (page, src)
        if page.startswith("experiments/"):
            assert 'id="measured"' in text, f"{page} has no measured table"
    tutorial = (site / "tutorial/index.html").read_text(encoding="utf-8")
    assert "status ok; mean cosine" in tutorial  # what the first cell printed, from this build


def test_the_tutorial_page_holds_each_cell_s_output_and_figures():
    source = "# %% [markdown]\n# # T\n\n# %%\nprint(1)\n\n# %%\nx = 2\n"
    outputs = [{"stdout": "1\n", "figures": ["a.png"]}, {"stdout": "", "figures": []}]
    page = hooks.tutorial_page(source, outputs)
    assert "```py\nprint(1)\n```\n\nOutput:\n\n```text\n1\n```\n\n![a.png](tutorial/a.png)" in page
    assert page.count("Output:") == 1  # a silent cell gets no output block


def test_an_experiment_page_shows_its_measured_rows(tmp_path):
    table = tmp_path / "table.md"
    table.write_text(
        "163 PASS, 0 FAIL (full run)\n\n"
        "| id | expectation | expected | measured | status |\n|---|---|---|---|---|\n"
        "| E1 | a | ≥ 1 | n=64: 1 | PASS |\n| E10 | b | ≥ 1 | n=64: 1 | PASS |\n",
        encoding="utf-8",
    )
    lines = hooks.measured_section("E1", table)
    assert lines[0] == "## Measured" and "163 PASS, 0 FAIL (full run)" in lines[2]
    assert [line for line in lines if line.startswith("| E")] == ["| E1 | a | ≥ 1 | n=64: 1 | PASS |"]
    assert hooks.measured_section("E2", table) == []


RUNNER = """
import sys
blocks = sys.stdin.read().split("\\0")
for number, block in enumerate(blocks):
    print(f"--- block {number}", flush=True)
    exec(compile(block, f"<{sys.argv[1]} block {number}>", "exec"), {"__name__": "__main__"})
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "path",
    [p for p in EXAMPLE_FILES if PYTHON_BLOCK.search(p.read_text(encoding="utf-8"))],
    ids=lambda p: p.name,
)
def test_python_examples_run(path):
    """Every ```python block of the file runs, each in a fresh namespace, in one fresh process."""
    blocks = PYTHON_BLOCK.findall(path.read_text(encoding="utf-8"))
    result = subprocess.run(
        [sys.executable, "-c", RUNNER, path.name],
        input="\0".join(blocks),
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{path.name}:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    assert result.stdout.count("--- block") == len(blocks)


# --- license and citation -------------------------------------------------------------------------


def test_license_is_the_one_pyproject_declares():
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["license"][
        "text"
    ]
    assert declared == "MIT"
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License\n\nCopyright (c) ")


def test_citation_names_the_software_and_the_paper():
    yaml = pytest.importorskip("yaml")
    import tomllib

    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert citation["cff-version"] == "1.2.0" and citation["type"] == "software"
    assert str(citation["version"]) == version and citation["license"] == "MIT"
    paper = citation["preferred-citation"]
    assert [a["family-names"] for a in paper["authors"]] == ["Imaizumi", "Koyama", "Isobe", "Hayashi"]
    assert paper["title"] == "Anti Mode-Collapse in Mean-Field Transformer via Auxiliary Variables"
    assert {"type": "other", "value": "arXiv:2605.30229", "description": "arXiv identifier"} in paper[
        "identifiers"
    ]


def test_the_readme_stands_alone_and_tells_a_newcomer_where_to_start():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert not OUTSIDE_REFERENCE.search(text)
    for command in get_command(app).commands:  # every command is introduced
        assert f"attnflow {command}" in text, command
    assert "attnflow reproduce --quick" in text  # the small version first
    # how long the main job and the tests take, in minutes, next to their commands
    assert re.search(r"reproduce.*\d+[–-]?\d* minutes", text, re.S)
    assert re.search(r"test suite \([^)]*\d+[–-]\d+ minutes", text)


BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
# Run in the page after MathJax: its images (loaded or not), rendered and failed formulas, whether
# the page is wider than the window, and every pair of the article's blocks that overlap (a block
# inside another apart), then the same after a deliberate break (the first paragraph pulled up over
# what is above it), which the probe must see.
PAGE_PROBE = """<script>
function overlaps() {
  const blocks = [...document.querySelectorAll(
    "article h1, article h2, article h3, article p, article li, article table, article img, article pre")]
    .filter(el => { const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0; });
  const found = [];
  blocks.forEach((a, i) => blocks.slice(i + 1).forEach(b => {
    if (a.contains(b) || b.contains(a)) return;
    const p = a.getBoundingClientRect(), q = b.getBoundingClientRect();
    const w = Math.min(p.right, q.right) - Math.max(p.left, q.left);
    const h = Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top);
    if (w > 0.5 && h > 0.5) found.push([a.tagName.toLowerCase(), b.tagName.toLowerCase()]);
  }));
  return found;
}
window.addEventListener("load", () => setTimeout(() => {
  const images = [...document.querySelectorAll("article img")];
  const seen = overlaps();
  document.querySelector("article p").style.marginTop = "-40px";
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify({
    images: images.length,
    loaded: images.filter(i => i.complete && i.naturalWidth > 0).length,
    maths: document.querySelectorAll("mjx-container").length,
    errors: document.querySelectorAll("mjx-merror, [data-mjx-error]").length,
    wide: document.documentElement.scrollWidth > innerWidth,
    overlaps: seen,
    broken: overlaps(),
  });
  document.body.append(out);
}, 3000));
</script>"""


def _probe_page(site: Path, page: str, tmp_path: Path) -> dict:
    source = site / page
    probed = source.with_name("probed.html")  # beside the page: its relative links still resolve
    probed.write_text(source.read_text(encoding="utf-8").replace("</body>", PAGE_PROBE + "</body>"))
    dom = subprocess.run(
        [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", f"--user-data-dir={tmp_path / page.replace('/', '_')}",
         "--window-size=1200,900", "--virtual-time-budget=20000", "--dump-dom", probed.as_uri()],
        check=True, capture_output=True, text=True, timeout=180,
    ).stdout  # fmt: skip
    probed.unlink()
    match = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert match, f"{page}: the probe did not run"
    return json.loads(html.unescape(match.group(1)))


@pytest.mark.slow
@pytest.mark.skipif(BROWSER is None, reason="no Chromium on this machine (CI installs one)")
def test_in_a_real_browser_the_maths_renders_offline_and_the_pages_show_their_images(site, tmp_path):
    model = _probe_page(site, "model/index.html", tmp_path)
    assert model["maths"] >= 10 and model["errors"] == 0 and not model["wide"], model
    assert model["overlaps"] == [] and any("p" in pair for pair in model["broken"]), model  # sees a break
    for page in ("tutorial/index.html", "experiments/E1/index.html"):
        shown = _probe_page(site, page, tmp_path)
        assert shown["images"] >= 1 and shown["loaded"] == shown["images"], (page, shown)
        assert not shown["wide"] and shown["overlaps"] == [], (page, shown)
