"""attnflow.viz.report: report.html has a table of contents and one section per experiment holding
its figure, its "why", its expectation table and its measured values; cells read as words ("not
measured", "worst seed: ..."), identical columns are merged, wide tables scroll, figures are small."""

from __future__ import annotations

import base64
import dataclasses
import html
import re
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest

from attnflow.io.outcomes import FigureData, JobResult, Outcome, time_label
from attnflow.viz import report
from attnflow.viz.why import WHY
from attnflow.workflows.experiments import Experiment, evaluate

N, T = 24, 11


def _experiment(eid: str) -> Experiment:
    expect = [
        {"text": "collapsed", "metric": "mean_cosine", "op": ">=", "bound": 0.5},
        {"text": "below its bound", "metric": "ks", "op": "<=", "bound_metric": "ks_bound"},
    ]
    data = {"id": eid, "title": f"title of {eid}", "setting": f"setting of {eid}", "shape": "circle",
            "sizes": [N], "seeds": [0, 1], "config": {"aux": {"kind": "positions"}},
            "expect": expect}  # fmt: skip
    return Experiment.model_validate(data)


def _job(eid: str, t_end: float) -> JobResult:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ts = np.linspace(0.0, t_end, T)
    figure = FigureData(
        color=np.arange(N, dtype=float),
        states={time_label(0.0): (x, x), time_label(None): (x, x)},
        series={"t": ts, "energy": 1.0 - np.exp(-ts), "mean_cosine": 1.0 - np.exp(-ts)},
    )
    final = {"mean_cosine": 0.9, "ks": 0.01, "ks_bound": 0.01, "ks_copy": 0.01, "energy_max": 1.0}
    values = [{"seed": s, "final": dict(final)} for s in (0, 1)]
    timing = {"wall_s": 1.0, "run_s": 0.5}  # build, compile and measure were not measured
    return JobResult(eid, "", eid, N, (0, 1), "ok", "", values, timing, figure)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("rep")
    experiments = [_experiment("E1"), _experiment("E5")]
    jobs = [_job("E1", 20.0), _job("E5", 100.0)]
    rows = [row for e in experiments for row in evaluate(e, [j for j in jobs if j.experiment == e.id])]
    report.write_report(out, Outcome(experiments, jobs, rows, quick=True, wall_s=1.0))
    return out


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.links, self.stack, self.sections = set(), [], [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href", "").startswith("#"):
            self.links.append(attrs["href"][1:])
        if tag == "h2":
            self.sections.append({"id": attrs.get("id"), "img": 0, "table": 0, "why": 0})
        elif self.sections:
            key = {"img": "img", "table": "table"}.get(tag)
            if key:
                self.sections[-1][key] += 1
            if tag == "p" and attrs.get("class") == "why":
                self.sections[-1]["why"] += 1


def _page(out) -> tuple[str, _Page]:
    text = (out / "report.html").read_text()
    parser = _Page()
    parser.feed(text)
    return text, parser


def test_the_table_of_contents_links_every_section(written):
    _, page = _page(written)
    assert {"summary", "overview", "e1", "e5", "timing"} <= set(page.links)
    assert set(page.links) <= page.ids  # no dangling anchor


def test_each_experiment_section_holds_its_figure_why_and_tables(written):
    text, page = _page(written)
    sections = {s["id"]: s for s in page.sections}
    for eid in ("e1", "e5"):
        assert sections[eid]["img"] >= 1 and sections[eid]["table"] == 2 and sections[eid]["why"] == 1
    assert WHY["E1"][:60] in text.replace("&#x27;", "'")
    assert (written / "figures" / "E1.png").is_file() and (written / "figures" / "E5.png").is_file()


def test_cells_read_as_words_and_columns_are_not_repeated(written):
    text, _ = _page(written)
    text = re.sub(r'<span class="nb">(.*?)</span>', r"\1", text)  # the words kept on one line, as read
    assert "worst seed: ks − ks_bound = 0" in text and "max(value" not in text
    assert "not measured" in text and "<td>0.00</td>" not in text  # build/compile/measure unknown
    assert "<th>ks = ks_bound</th>" in text  # equal in every row: one column, both names
    assert text.count("<th>ks_bound") == 0


def test_wide_tables_scroll_and_the_page_is_self_contained(written):
    text, _ = _page(written)
    assert re.search(r"\.scroll\{[^}]*overflow-x:auto", text) and 'class="scroll"' in text
    assert "max-width" in text
    assert "<script" not in text and "http" not in text


def test_figures_are_embedded_compressed(written):
    text, _ = _page(written)
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', text)
    originals = [p for p in (written / "figures").glob("*.png") if p.name != "comparison.png"]
    assert len(embedded) == len(originals)
    # every figure is written as a palette PNG and embedded as it is (no second encoding)
    from PIL import Image

    for path in originals:
        with Image.open(path) as image:
            assert image.mode == "P", path.name
    assert sorted(embedded) == sorted(base64.b64encode(p.read_bytes()).decode("ascii") for p in originals)
    assert (written / "report.html").stat().st_size < 2_000_000


def test_the_energy_overview_plots_the_relative_gap_per_experiment_horizon(tmp_path, monkeypatch):
    captured = {}
    real = report.plotting.write_series_panels

    def spy(path, groups, **options):
        captured[path.name] = (groups, options)
        return real(path, groups, **options)

    monkeypatch.setattr(report.plotting, "write_series_panels", spy)
    # its own folder: redrawn into the module's report, the figures would no longer be the embedded ones
    report.write_figures(tmp_path, Outcome([_experiment("E1")], [_job("E1", 20.0)], [], True, 1.0))
    groups, options = captured["energy.png"]
    ((title, curves),) = groups
    assert title == "E1: (E_max − E)/E_max" and options["logy"] == [True]
    _, ts, gap = curves[0]
    # E_max = 1, E = 1 - e^{-t}; atol: 1 - (1 - e^{-t}) cancels to round-off of 1
    np.testing.assert_allclose(gap, np.exp(-ts), rtol=1e-12, atol=1e-15)


def test_cells_wrap_between_words_only(written):
    text, _ = _page(written)
    css = re.search(r"<style>(.*?)</style>", text, re.S).group(1)
    assert "anywhere" not in css and "break-all" not in css  # "12|8", "statu|s" at 1400 px
    cells = re.search(r"th,td\{([^}]*)\}", css).group(1)
    assert "overflow-wrap:normal" in cells and "word-break:normal" in cells
    assert re.search(r"(^|[}\s])th\{[^}]*white-space:nowrap", css)  # a header stays one line


def test_the_report_s_figures_hold_their_layout(tmp_path, monkeypatch):
    from figure_layout import capture_figures

    experiments = [_experiment("E1"), _experiment("E5")]
    jobs = [_job("E1", 20.0), _job("E5", 100.0)]
    rows = [row for e in experiments for row in evaluate(e, [j for j in jobs if j.experiment == e.id])]
    with capture_figures(monkeypatch) as saved:
        report.write_figures(tmp_path, Outcome(experiments, jobs, rows, quick=True, wall_s=1.0))
    assert len(saved) >= 4
    assert [p for _, found in saved for p in found] == []


def test_one_clock_names_the_same_wall_time_in_every_output(tmp_path):
    import json

    from rich.console import Console

    experiments = [_experiment("E1")]
    jobs = [_job("E1", 20.0)]
    rows = evaluate(experiments[0], jobs)
    outcome = Outcome(experiments, jobs, rows, quick=True, wall_s=1.0)
    report.write_report(tmp_path, outcome, clock=lambda: 12.345)  # read once, after the figures
    assert outcome.wall_s == 12.345
    assert json.loads((tmp_path / "results.json").read_text())["wall_time_s"] == 12.345
    assert "wall time 12.35 s" in (tmp_path / "table.md").read_text().splitlines()[0]
    assert "wall time 12.3 s" in (tmp_path / "report.html").read_text()
    console = Console(record=True, width=100)
    console.print(report.summary_table(outcome))
    assert "attnflow reproduce (wall time 12.3 s)" in console.export_text()


def test_summary_rows_say_what_a_size_without_expectations_is():
    experiment = Experiment.model_validate(
        {
            "id": "E9",
            "title": "t",
            "setting": "s",
            "shape": "circle",
            "sizes": [N, 2 * N],
            "seeds": [0],
            "config": {},
            "expect": [
                {
                    "text": "some size",
                    "metric": "mean_cosine",
                    "op": ">=",
                    "bound": 0.5,
                    "across": "some size",
                }
            ],
        }  # fmt: skip
    )
    import dataclasses

    jobs = [_job("E9", 20.0), dataclasses.replace(_job("E9", 20.0), n=2 * N)]
    rows = evaluate(experiment, jobs)
    table = report._summary_rows(Outcome([experiment], jobs, rows, quick=True, wall_s=1.0))
    assert all("—" not in cell for row in table for cell in row)  # no cell reads as a missing result
    assert any(row[1] == "any n" and row[3] == "(rows above)" for row in table)


def test_the_readme_gets_the_summary_line_and_the_docs_the_full_table(tmp_path):
    import json

    from attnflow.viz import expectation_table

    experiments = [_experiment("E1")]
    rows = evaluate(experiments[0], [_job("E1", 20.0)])
    results = {"experiments": {"E1": {"expectations": rows}}, "counts": {"PASS": 3, "FAIL": 0, "SKIP": 1},
               "quick": False, "attnflow_version": "0", "wall_time_s": 41.5}  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps(results))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{expectation_table.START}\nold table\n{expectation_table.END}\nafter\n")
    expectation_table.main([str(tmp_path / "results.json"), str(readme)])
    text = readme.read_text()
    assert "old table" not in text and "| E1 |" not in text  # no table in the README
    assert "3 PASS, 0 FAIL, 1 SKIP (full run, attnflow 0, wall time 41.5 s)" in text
    table = (tmp_path / "docs" / "figures" / "reproduce_table.md").read_text()
    assert table == expectation_table.markdown_table(results) and "| E1 |" in table


BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
# Run in the page by Chromium: every word of a table cell that the layout split over two lines,
# and whether the page is wider than the window (tables scroll inside their own box instead).
LAYOUT_PROBE = """<script>
const broken = [];
for (const cell of document.querySelectorAll("td, th")) {
  const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (const m of node.data.matchAll(/\\S+/g)) {
      const range = document.createRange();
      range.setStart(node, m.index); range.setEnd(node, m.index + m[0].length);
      if (new Set([...range.getClientRects()].map(r => Math.round(r.top))).size > 1) broken.push(m[0]);
    }
  }
}
// every pair of the page's blocks (headings, paragraphs, tables, figures, lists) that overlap,
// a block inside another apart
const blocks = [...document.querySelectorAll("h1, h2, h3, p, nav, li, table, figure, img, figcaption, pre")]
  .filter(el => { const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0; });
const overlaps = [];
blocks.forEach((a, i) => blocks.slice(i + 1).forEach(b => {
  if (a.contains(b) || b.contains(a)) return;
  const p = a.getBoundingClientRect(), q = b.getBoundingClientRect();
  const w = Math.min(p.right, q.right) - Math.max(p.left, q.left);
  const h = Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top);
  if (w > 0.5 && h > 0.5) overlaps.push([a.tagName.toLowerCase(), b.tagName.toLowerCase()]);
}));
const out = document.createElement("pre");
out.id = "probe";
out.textContent = JSON.stringify({broken, overlaps, wide: document.documentElement.scrollWidth > innerWidth});
document.body.append(out);
</script>"""


def _probe(html_text: str, tmp_path, width: int) -> dict:
    import json

    page = tmp_path / f"probe{width}.html"
    page.write_text(html_text.replace("</body>", LAYOUT_PROBE + "</body>"), encoding="utf-8")
    dom = subprocess.run(
        [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", f"--user-data-dir={tmp_path / f'profile{width}'}",
         f"--window-size={width},900", "--dump-dom", page.as_uri()],
        check=True, capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    return json.loads(html.unescape(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S).group(1)))


@pytest.mark.slow
@pytest.mark.skipif(BROWSER is None, reason="no Chromium on this machine (CI installs one)")
def test_at_1400_px_no_number_or_header_is_broken_mid_word_in_a_real_browser(written, tmp_path):
    # the probe can fail: the old rule (overflow-wrap:anywhere) breaks a number in a narrow column
    control = (
        "<html><body><table style='width:60px'><tr><td style='overflow-wrap:anywhere'>"
        "1234567890123</td><td>status</td></tr></table><h2>a heading</h2>"
        "<p style='margin-top:-30px'>pulled over the heading</p></body></html>"
    )
    seen = _probe(control, tmp_path, 400)
    assert seen["broken"] == ["1234567890123"] and seen["overlaps"] == [["h2", "p"]]  # the probe sees both
    result = _probe((written / "report.html").read_text(encoding="utf-8"), tmp_path, 1400)
    assert result == {"broken": [], "overlaps": [], "wide": False}
    # a wide table of intervals (as E1's measured values): a browser may break "2.7e-09" at its "-"
    from attnflow.viz.report_page import html_page

    header = ["status"] + [f"n={n}" for n in range(64, 64 * 13, 64)]
    rows = [["PASS"] + ["[2.7e-09, 3.46e-09] over seeds"] * 12 for _ in range(3)]
    wide = html_page([("table", (header, rows))], tmp_path)
    # it scrolls in its own box
    assert _probe(wide, tmp_path, 700) == {"broken": [], "overlaps": [], "wide": False}


def test_variants_that_start_alike_show_their_initial_state_once(tmp_path, monkeypatch):
    captured = {}
    real = report.plotting.write_comparison_figure

    def spy(path, panels, **options):
        captured[path.name] = list(panels)
        return real(path, panels, **options)

    monkeypatch.setattr(report.plotting, "write_comparison_figure", spy)
    variants = [dataclasses.replace(_job("E1", 20.0), variant=v, label=f"E1 ({v})") for v in "abc"]
    same_start, other = variants[:2], variants[2]  # (a) and (b) from one initial state, (c) not
    x0, _ = other.figure.states[time_label(0.0)]
    other.figure.states[time_label(0.0)] = (x0[::-1].copy(), x0[::-1].copy())  # another start
    report.write_figures(tmp_path, Outcome([_experiment("E1")], [*same_start, other], [], True, 1.0))
    panels = captured["E1.png"]
    assert len(panels) == 9  # three rows of three cells
    starts = [p for p in panels[0::3] if p is not None]
    assert panels[3] is None and len(starts) == 2  # the shared start once, the other start again
    assert all("τ = 0" in p["title"] for p in starts)
    assert panels[4]["title"].startswith("E1 (b), n=24, seed 0\n")  # the row named over its first panel
