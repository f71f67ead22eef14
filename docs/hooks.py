"""MkDocs hooks: the pages generated from the code at build time.

Three references are written from the code each time the site is built, so they cannot drift:

- ``reference/config.md`` from the pydantic schema (:mod:`attnflow.io.config_schema`): every key,
  its type, default, constraint and meaning, and the rules that tie keys together
  (:data:`attnflow.io.config_rules.RULES`);
- ``reference/cli.md`` from the typer app (``typer.main.get_command(attnflow.cli.app)``): each
  command's help, arguments and options;
- ``experiments/E*.md`` from the experiment files ``attnflow/workflows/paper/E*.toml``: setting,
  configuration, variants, expectations, and why the experiment matters.

The functions return Markdown strings; ``tests/test_docs.py`` calls them directly too.
"""

from __future__ import annotations

import json
import re
import types
import typing
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from attnflow.viz.why import WHY

# --- what each config key means (a key missing here shows the schema's own field description) ---

KEY_MEANINGS: dict[str, str] = {
    "model.n": "number of tokens",
    "model.d": "content dimension: tokens live on the sphere S^{d-1} in R^d",
    "model.beta": "inverse temperature β of the profile",
    "model.time_scale": "`plain`: c = 1; `rescaled`: c = e^{-β}, φ(t) = e^{β(t-1)}/β (time τ in one "
    "convention is τ e^β in the other)",
    "model.profile": "`exp`: φ(t) = (c/β) e^{βt}; `linear`: φ(t) = c t (for spectral analysis)",
    "model.normalization": "`usa`: divide the attention sum by n; `sa`: softmax, divide row i by "
    "Σ_k w_ik e^{β s_ik} (needs a non-negative factor)",
    "model.causal": "token i sees only the tokens whose position is at most its own (not a gradient flow)",
    "model.value": "`gradient`: value Q(ξ_i)ᵀQ(ξ_j) y_j, the gradient flow of the energy; "
    "`logits_only`: the rotation acts in the logits only (value y_j), not a gradient flow, collapses",
    "model.noise": "1/κ: diffusion sqrt(2/κ) P_x dW on the sphere; 0 is deterministic",
    "aux.kind": "the frozen labels ξ: `none`, `positions`, `prompts` (ids 0..K-1) or `file`",
    "aux.spacing": "positions: `index` (ξ_i = i), `unit` (i/n), `midpoint` ((i+1/2)/n) or a step",
    "aux.n_prompts": "prompts: the number K of prompt ids",
    "aux.assignment": "prompts: `cyclic` (ξ_i = i mod K) or `random` (seeded by `aux.seed`)",
    "aux.seed": "prompts: the seed of a random assignment",
    "aux.path": "file: an `.npy` array of labels, shape (n,) or (n, k)",
    "gauge.kind": "the gauge Q(ξ): `none` (Q = I), `rope`, `generalized_rope`, `prompt` or `file`",
    "gauge.frequencies": "rope: `roformer` (θ_k = base^{-2(k-1)/d}), `full_period` (θ_1 = 2π/n: "
    "positions 0..n-1 cover one turn) or a list of frequencies",
    "gauge.base": "rope `roformer`: the base of the frequencies",
    "gauge.preset": "rope: the RoPE of a published model (`llama2`, `llama3`, `llama3.1`, `qwen2`, "
    "`mistral`, `gpt-neox`, `gpt-j`, `gemma`): its base, rotary part, pair layout and scaling; the "
    "gauge's dimension must be its head dimension",
    "gauge.scaling": "with `gauge.preset`: `preset` (the model's own long-context rule), `none`, or a rule "
    "applied instead: `linear`, `ntk`, `yarn` (which also multiplies β by (0.1 ln s + 1)²), `llama3`, with "
    "`gauge.scaling_factor` s",
    "gauge.axes": "generalized_rope (d = 3): one rotation generator per axis, applied in order",
    "gauge.generators": "generalized_rope: skew-symmetric generators G_k (replaces `axes`)",
    "gauge.rates": "generalized_rope: the rates ω_k as multiples of `gauge.omega`",
    "gauge.omega": "generalized_rope: the base rate, `full_period` (2π/n) or a number",
    "gauge.seed": "prompt: the seed of the Haar-random matrices Q_k",
    "gauge.path": "file: an `.npy` array of orthogonal matrices Q(ξ_i), shape (n, d, d)",
    "factor.kind": "the factor w(ξ, ζ): `none` (w = 1), `distance_bias`, `toeplitz_cos` or `file`",
    "factor.slope": "distance_bias: m in w = exp(-m |ξ - ζ|)",
    "factor.omega": "toeplitz_cos: ω in w = cos(ω (ξ - ζ))",
    "factor.path": "file: an `.npy` symmetric matrix W, shape (n, n)",
    "init.kind": "initial data: `uniform` on the sphere, `cap`, `equiangular` or `file`",
    "init.seed": "the seed of the initial data",
    "init.center": "cap: the direction of the cap (in the gauge frame when a gauge is set)",
    "init.sigma": "cap: the spread of the cap",
    "init.rho0": "equiangular: the common cosine ⟨x_i, x_j⟩ = ρ_0",
    "init.path": "file: an `.npy` array of initial points, shape (n, d)",
    "solver.method": "`euler`, `rk4`, `geodesic_rk4` (exponential-map steps) or `adaptive` "
    "(Dormand–Prince 5(4) with error control)",
    "solver.dt": "the step (fixed-step methods), or the first trial step (adaptive)",
    "solver.t_end": "the final time τ",
    "solver.save_every": "time between stored snapshots (a whole multiple of `dt` for fixed steps)",
    "solver.rtol": "adaptive: relative tolerance",
    "solver.atol": "adaptive: absolute tolerance",
    "solver.dtype": "precision of the state: `float64` (default) or `float32`",
    "solver.block_size": "rows per block of the blocked evaluation; unset: chosen from n and dtype",
    "storage.token_stride": "keep tokens 0, k, 2k, ... of each snapshot in `trajectory.zarr` (with their "
    "labels and gauge matrices); metrics still use every token (see Large runs)",
    "storage.dtype": "precision of the stored snapshots: `float64`, `float32`, or unset (the solver's "
    "dtype); `--resume` needs the solver's",
    "storage.snapshots": "`all` saved times, or `final`: the store keeps the initial and the last "
    "snapshot (metrics.json still has every saved time; a run that stops early keeps its last one)",
}

# --- config reference --------------------------------------------------------------------------


def type_name(annotation: Any) -> str:
    """A short, readable name of a field's type (``int``, ``"exp" | "linear"``, ``list[float]``)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(type_name(a) for a in args)
    if origin is tuple:
        inner = type_name(args[0]) if args else "any"
        return f"list[{inner}]"
    if annotation is type(None):
        return "none"
    return getattr(annotation, "__name__", str(annotation))


def _constraints_of(metadata: list[Any]) -> list[str]:
    signs = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤"}
    out = []
    for item in metadata:
        for attribute, sign in signs.items():
            if isinstance(item, getattr(annotated_types, attribute.capitalize())):
                out.append(f"{sign} {getattr(item, attribute)}")
        if isinstance(item, annotated_types.MinLen):
            out.append(f"at least {item.min_length} entries" if item.min_length > 1 else "non-empty")
    return out


def constraints(annotation: Any, metadata: list[Any]) -> str:
    """The constraints of a field: its own metadata and those inside ``Annotated`` members."""
    found = _constraints_of(metadata)
    stack = [annotation]
    while stack:
        current = stack.pop()
        if typing.get_origin(current) is typing.Annotated:
            found += _constraints_of(list(current.__metadata__))
            current = typing.get_args(current)[0]
        stack.extend(a for a in typing.get_args(current) if typing.get_origin(current) is not typing.Literal)
    return ", ".join(dict.fromkeys(found)) or "—"


def default_text(field: Any) -> str:
    if field.default is PydanticUndefined:
        return "(required)"
    value = field.default
    if isinstance(value, tuple):
        value = list(value)
    return f"`{json.dumps(value)}`" if value is not None else "unset"


def config_keys() -> dict[str, tuple[type[BaseModel], str]]:
    """Every ``section.key`` of the schema with its section model and field name."""
    from attnflow.io.config_schema import SECTIONS

    return {f"{s}.{k}": (model, k) for s, model in SECTIONS.items() for k in model.model_fields}


def meaning(key: str, field: Any) -> str:
    """What a key means: :data:`KEY_MEANINGS`, else the schema's own field description."""
    return KEY_MEANINGS.get(key) or field.description or ""


def config_reference() -> str:
    from attnflow.io.config_rules import RULES
    from attnflow.io.config_schema import SECTIONS

    lines = [
        "# Configuration reference",
        "",
        "Generated at build time from the configuration schema (`attnflow.io.config_schema`): it lists",
        "every key the TOML file and `--set section.key=value` accept, so it cannot drift from the code.",
        "Unknown keys are refused (with a *did you mean*), as are values of the wrong type or outside",
        "their range: one line naming the key, the constraint and the value, exit code 2.",
        "",
        "```toml",
        "[model]",
        "n = 128",
        "beta = 1.0",
        "",
        "[gauge]",
        'kind = "rope"',
        "```",
        "",
    ]
    for section, model in SECTIONS.items():
        doc = " ".join((model.__doc__ or "").split())
        lines += [f"## `[{section}]`", "", doc, "", "| key | type | default | constraint | meaning |"]
        lines += ["|---|---|---|---|---|"]
        for name, field in model.model_fields.items():
            key = f"{section}.{name}"
            row = [
                f"`{key}`",
                type_name(field.annotation),
                default_text(field),
                constraints(field.annotation, list(field.metadata)),
                meaning(key, field).replace("|", "\\|"),
            ]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    lines += [
        "## Rules between keys",
        "",
        "Checked once every key is valid, in this order (each names the key to change):",
        "",
    ]
    lines += [f"1. {rule.__name__.strip('_').replace('_', ' ')}" for rule in RULES]
    lines += ["", "Relative paths in a config resolve against the config file's folder.", ""]
    return "\n".join(lines)


# --- CLI reference --------------------------------------------------------------------------------


def _is_argument(param: Any) -> bool:
    return param.param_type_name == "argument"


def _param_row(param: Any) -> str:
    """One table row of a command's parameter (typer's own parameter objects, duck-typed)."""
    if _is_argument(param):
        name = f"`{param.name.upper()}`"
    else:
        name = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
    kind = "flag" if getattr(param, "is_flag", False) else param.bare_type().strip("<>")
    default = param.default if not callable(param.default) else None
    if param.required:
        default_cell = "(required)"
    elif default in (None, [], ()) or getattr(param, "is_flag", False) and default is False:
        default_cell = "—"
    else:
        default_cell = f"`{default}`"
    help_text = " ".join((getattr(param, "help", None) or "").split()).replace("|", "\\|")
    if getattr(param, "multiple", False):
        help_text += " (repeatable)"
    return f"| {name} | {kind} | {default_cell} | {help_text} |"


def cli_reference() -> str:
    import typer

    from attnflow.cli import app

    group = typer.main.get_command(app)
    lines = [
        "# Command-line reference",
        "",
        "Generated at build time from the `attnflow` command itself (also `python -m attnflow`).",
        "",
        (group.help or "").strip(),
        "",
    ]
    top = [p for p in group.params if not p.hidden and p.name != "help"]
    if top:
        lines += ["## `attnflow`", "", "| option | type | default | meaning |", "|---|---|---|---|"]
        lines += [_param_row(p) for p in top] + [""]
    lines += _command_sections(group, "attnflow")
    return "\n".join(lines)


def _command_sections(group, prefix: str) -> list[str]:
    """A section per visible command of ``group``, and of each command of its sub-groups
    (``attnflow config show``)."""
    lines: list[str] = []
    for name in sorted(group.commands):
        command = group.commands[name]
        if command.hidden:
            continue
        if getattr(command, "commands", None):  # a group of commands
            lines += _command_sections(command, f"{prefix} {name}")
            continue
        params = [p for p in command.params if not getattr(p, "hidden", False) and p.name != "help"]
        usage = " ".join(p.name.upper() for p in params if _is_argument(p))
        lines += [
            f"## `{prefix} {name}`",
            "",
            f"```\n{prefix} {name} {usage} [OPTIONS]\n```".replace("  ", " "),
        ]
        lines += ["", (command.help or "").strip(), ""]
        lines += ["| argument / option | type | default | meaning |", "|---|---|---|---|"]
        lines += [_param_row(p) for p in params] + [""]
    return lines


# --- experiment pages -------------------------------------------------------------------------------


DOCS = Path(__file__).resolve().parent
FIGURES = DOCS / "figures"  # docs/figures/E1.png, E1_a.svg, ... shown when present


def _clean(text: str) -> str:
    """Drop references to outside documents from a comment (``SPEC §6 E1:``, ``(SPEC §1.1)``, ``(§3.1)``)."""
    text = re.sub(r"\s*\((SPEC\s*)?§[\d.]+\)", "", text)
    return re.sub(r"SPEC\s*§[\d.]+\s*(E\d+)?:?\s*", "", text).strip()


def header_comment(source: str) -> str:
    lines = []
    for line in source.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return _clean(" ".join(lines))


def _bound_text(e: Any) -> str:
    if e.op == "in":
        return f"in [{e.bound[0]:g}, {e.bound[1]:g}]"
    bound = (
        f"`{e.bound_metric}`"
        if e.bound_metric
        else (f"{e.bound:g}" if isinstance(e.bound, float) else str(e.bound))
    )
    tol = f" ± {e.tol:g}" if e.op == "~=" else (f" + {e.tol:g}" if e.tol else "")
    return f"{e.op} {bound}{tol}"


def experiment_page(experiment: Any, source: str) -> str:
    e = experiment
    lines = [f"# {e.id}: {e.title}", "", f"**Setting.** {e.setting}.", ""]
    if e.shape:
        lines += [f"**Expected shape of the final state.** {e.shape}.", ""]
    lines += [f"**Why it matters.** {WHY.get(e.id, '')}", ""]
    note = header_comment(source)
    if note:
        lines += [f"**In the experiment file.** {note}", ""]
    lines += [
        f"**Runs.** kind `{e.kind}`; sizes n ∈ {list(e.sizes)}; seeds {list(e.seeds)} "
        f"(`--quick`: n ∈ {list(e.quick.sizes)}, seeds {list(e.quick.seeds)}).",
        "",
    ]
    if e.kind == "simulate":
        lines += ["## Configuration", "", "Set on top of the defaults (model.n and init.seed per run):", ""]
        lines += ["```toml"]
        for section, values in e.config.items():
            lines += [f"[{section}]", *(f"{k} = {json.dumps(v)}" for k, v in values.items()), ""]
        lines[-1] = "```"
        lines.append("")
    else:
        lines += ["## Realisation parameters", "", "| parameter | value |", "|---|---|"]
        lines += [f"| `{k}` | `{json.dumps(v)}` |" for k, v in e.realize.items()] + [""]
    named = [v for v in e.variants if v.name]
    if named:
        lines += ["## Variants", "", "| variant | overrides |", "|---|---|"]
        lines += [
            f"| {v.label or v.name} | {', '.join(f'`{o}`' for o in v.overrides) or '—'} |" for v in named
        ]
        lines.append("")
    lines += ["## Expectations", "", "Each row is checked by `attnflow reproduce`; PASS or FAIL per row.", ""]
    lines += ["| expectation | metric | test | over | where |", "|---|---|---|---|---|"]
    for x in e.expect:
        where = []
        if x.at is not None:
            where.append(f"τ = {x.at:g}")
        if x.sizes:
            where.append(f"n ∈ {list(x.sizes)}")
        if x.variants:
            where.append(f"variants {', '.join(x.variants)}")
        if x.across == "some size":
            where.append("some size")
        scope = f"{x.scope} (≥ {x.min_count} seeds)" if x.scope == "count" else x.scope
        cells = [x.text, f"`{x.metric}`", _bound_text(x), scope, ", ".join(where) or "final state"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += ["", f"Run it alone: `attnflow reproduce --only {e.id}`.", ""]
    figures = sorted(p for p in FIGURES.glob(f"{e.id}[._]*") if p.suffix in (".png", ".svg"))
    if figures:
        lines += ["## Figures", ""]
        lines += [f"![{e.id}: {p.stem}](../figures/{p.name})" for p in figures] + [""]
    lines += measured_section(e.id)
    return "\n".join(lines)


MEASURED = FIGURES / "reproduce_table.md"  # table.md of a full `attnflow reproduce`, copied here


def measured_section(experiment_id: str, table: Path | None = None) -> list[str]:
    """The lines of ``## Measured``: the rows of experiment ``experiment_id`` in the table of a
    reproduce run (``docs/figures/reproduce_table.md``), under its summary line; none without it."""
    table = MEASURED if table is None else table
    if not table.is_file():
        return []
    text = table.read_text(encoding="utf-8").splitlines()
    summary = next((line for line in text if line.strip() and not line.startswith("|")), "")
    header = [line for line in text if line.startswith("| id |") or line.startswith("|---")][:2]
    rows = [line for line in text if line.startswith(f"| {experiment_id} |")]
    if not rows or len(header) != 2:
        return []
    note = f"Measured by `attnflow reproduce` ({summary.strip()}); every seed, every size:"
    return ["## Measured", "", note, "", *header, *rows, ""]


def experiment_pages() -> dict[str, str]:
    """``{"experiments/E0.md": markdown, ...}`` plus the overview page."""
    from importlib import resources

    from attnflow.workflows.experiments import load_experiments

    experiments = load_experiments()
    folder = resources.files("attnflow.workflows") / "paper"
    pages = {}
    rows = ["| id | title | setting |", "|---|---|---|"]
    for e in experiments:
        source = (folder / f"{e.id}.toml").read_text(encoding="utf-8")
        pages[f"experiments/{e.id}.md"] = experiment_page(e, source)
        setting = e.setting.replace("|", "\\|")
        rows.append(f"| [{e.id}]({e.id}.md) | {e.title} | {setting} |")
    overview = [
        "# The experiments",
        "",
        "The paper's experiments are data: one TOML file each in `attnflow/workflows/paper/`, with its",
        "setting and its expectations. These pages are generated from those files at build time.",
        "`attnflow reproduce` runs them all and checks every expectation for every seed.",
        "",
        *rows,
        "",
    ]
    pages["experiments/index.md"] = "\n".join(overview)
    return pages


def _cells(source: str) -> list[tuple[str, str]]:
    """The cells of a jupytext "percent" script: ``("markdown" | "code", text)``."""
    cells = []
    for cell in re.split(r"^# %%", source, flags=re.M)[1:]:
        header, _, body = cell.partition("\n")
        if "[markdown]" in header:
            text = "\n".join(
                line[2:] if line.startswith("# ") else line.lstrip("#") for line in body.splitlines()
            )
            cells.append(("markdown", text))
        elif body.strip():
            cells.append(("code", body.strip()))
    return cells


def tutorial_page(source: str, outputs: list[dict] | None = None) -> str:
    """The tutorial (a jupytext "percent" script) as a page: markdown cells as text, code cells as
    ``py`` blocks (not ``python``: the script itself is what the tests run, once), each followed by
    what it printed and drew when ``outputs`` (one ``{"stdout", "figures"}`` per code cell, from
    :func:`run_tutorial`) is given."""
    parts, code = [], 0
    for kind, text in _cells(source):
        if kind == "markdown":
            parts.append(text)
            continue
        parts.append("```py\n" + text + "\n```")
        if outputs is not None and code < len(outputs):
            printed = outputs[code]["stdout"].rstrip()
            if printed:
                parts.append("Output:\n\n```text\n" + printed + "\n```")
            parts += [f"![{name}](tutorial/{name})" for name in outputs[code]["figures"]]
        code += 1
    return "\n\n".join(parts) + "\n\nThe whole script: `docs/tutorial.py`.\n"


# Runs the code cells of the tutorial in one namespace, in a fresh process, recording what each
# printed and which figures it wrote into the output folder (the working directory).
TUTORIAL_RUNNER = """
import contextlib, io, json, sys
from pathlib import Path
cells = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
namespace, outputs, seen = {"__name__": "__main__"}, [], set()
for number, code in enumerate(cells):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, f"<tutorial cell {number}>", "exec"), namespace)
    figures = sorted(p.name for p in Path.cwd().glob("*.png") if p.name not in seen)
    seen.update(figures)
    outputs.append({"stdout": printed.getvalue(), "figures": figures})
Path("outputs.json").write_text(json.dumps(outputs), encoding="utf-8")
"""
TUTORIAL_RUN_ENV = "ATTNFLOW_DOCS_TUTORIAL"  # "skip": the page without outputs (a quick `mkdocs serve`)


def run_tutorial(source: str, cache: Path) -> tuple[list[dict], Path] | None:
    """Execute the tutorial's code cells and return their outputs and the folder of their figures.

    The outputs are kept in ``cache/<hash of the script and attnflow's version>/``: a rebuild of
    an unchanged tutorial reads them back instead of running it again. None when
    ``$ATTNFLOW_DOCS_TUTORIAL`` is ``skip``. A failing cell fails the build with its error."""
    import hashlib
    import os
    import subprocess
    import sys

    import attnflow

    if os.environ.get(TUTORIAL_RUN_ENV) == "skip":
        return None
    key = hashlib.sha256(f"{attnflow.__version__}\0{source}".encode()).hexdigest()[:16]
    folder = cache / key
    if not (folder / "outputs.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        cells = [text for kind, text in _cells(source) if kind == "code"]
        (folder / "cells.json").write_text(json.dumps(cells), encoding="utf-8")
        result = subprocess.run(
            [sys.executable, "-c", TUTORIAL_RUNNER, str(folder / "cells.json")],
            cwd=folder,
            env={**os.environ, "TUTORIAL_OUT": str(folder), "MPLBACKEND": "Agg"},
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"docs: the tutorial failed while the site was built:\n{result.stderr[-3000:]}"
            )
    return json.loads((folder / "outputs.json").read_text(encoding="utf-8")), folder


def generated_pages() -> dict[str, str]:
    return {
        "reference/config.md": config_reference(),
        "reference/cli.md": cli_reference(),
        "tutorial.md": tutorial_page((DOCS / "tutorial.py").read_text(encoding="utf-8")),
        **experiment_pages(),
    }


# --- mkdocs hooks ----------------------------------------------------------------------------------

OPTIONAL_PAGES = {"Failures and statuses": "faults.md"}


def on_config(config):
    """Fill the "Experiments" entry of the navigation with one page per experiment file."""
    from attnflow.workflows.experiments import load_experiments

    entries = [{"Overview": "experiments/index.md"}]
    entries += [{f"{e.id}: {e.title}": f"experiments/{e.id}.md"} for e in load_experiments()]
    for item in config.nav or []:
        if isinstance(item, dict) and "Experiments" in item:
            item["Experiments"] = entries
    # pages other parts of the project write, listed when they exist
    for title, page in OPTIONAL_PAGES.items():
        if (Path(config.docs_dir) / page).is_file() and config.nav is not None:
            config.nav.append({title: page})
    return config


# --- maths: MathJax served from the site itself -------------------------------------------------

MATHJAX_PAGE = "javascripts/mathjax/tex-svg.js"  # the extra_javascript entries of mkdocs.yml
MATHJAX_CONFIG_PAGE = "javascripts/mathjax-config.js"
# arithmatex (generic mode) wraps the maths of a page in \\( \\) and \\[ \\] inside elements of
# class "arithmatex"; MathJax typesets those only. SVG output: the glyphs are paths in the script,
# so the site needs no font file and no outside host.
MATHJAX_CONFIG = """window.MathJax = {
  tex: { inlineMath: [["\\\\(", "\\\\)"]], displayMath: [["\\\\[", "\\\\]"]], processEscapes: true,
         processEnvironments: true },
  options: { ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex", enableMenu: false },
  svg: { fontCache: "global" }
};
"""


def mathjax_script() -> Path:
    """MathJax 3's single-file TeX-to-SVG build, from the ``django-static-mathjax`` package (the
    docs extra): copied into the site, never fetched."""
    import mathjax  # the package's import name

    path = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5" / "tex-svg.js"
    if not path.is_file():
        raise FileNotFoundError(
            f"docs: `{path}` must exist (MathJax of the django-static-mathjax package); "
            "install the docs extra: pip install -e '.[test]'."
        )
    return path


def on_files(files, config):
    from mkdocs.structure.files import File

    for path, content in generated_pages().items():
        files.append(File.generated(config, path, content=content))
    source = (DOCS / "tutorial.py").read_text(encoding="utf-8")
    ran = run_tutorial(source, DOCS.parent / "tutorial_output" / "site")
    if ran is not None:  # the tutorial page again, with what each cell printed and drew
        outputs, folder = ran
        files.remove(files.get_file_from_path("tutorial.md"))
        files.append(File.generated(config, "tutorial.md", content=tutorial_page(source, outputs)))
        for name in (name for cell in outputs for name in cell["figures"]):
            files.append(File.generated(config, f"tutorial/{name}", abs_src_path=str(folder / name)))
    files.append(File.generated(config, MATHJAX_CONFIG_PAGE, content=MATHJAX_CONFIG))
    files.append(File.generated(config, MATHJAX_PAGE, abs_src_path=str(mathjax_script())))
    return files
