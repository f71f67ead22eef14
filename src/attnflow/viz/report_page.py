"""The reproduce report's pages from its blocks: ``report.md`` and a self-contained ``report.html``.

A block is ``("h1" | "p" | "why", text)``, ``("h2", (anchor, text))``, ``("toc", [(anchor,
text)])``, ``("table", (header, rows))``, ``("img", path)`` (a figure, embedded in the HTML as a
256-colour palette PNG) or ``("link", path)`` (a figure linked, not embedded). The HTML has inline
CSS and no script: it opens offline; tables scroll sideways inside the page rather than widen it,
and their cells wrap between words only (a number or a header is never broken, "12|8").
"""

from __future__ import annotations

import base64
import html
import io
import re
from pathlib import Path
from typing import Any

__all__ = ["CSS", "html_page", "markdown_page"]


def markdown_page(blocks: list[tuple[str, Any]], out_dir: Path) -> str:
    cell = lambda text: str(text).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = []
    for kind, content in blocks:
        if kind == "h1":
            lines += [f"# {content}", ""]
        elif kind == "h2":
            lines += [f'<a id="{content[0]}"></a>', "", f"## {content[1]}", ""]
        elif kind == "toc":
            lines += [f"- [{text}](#{anchor})" for anchor, text in content] + [""]
        elif kind == "p":
            lines += [content, ""]
        elif kind == "why":
            lines += [f"**Why it matters.** {content}", ""]
        elif kind == "img":
            lines += [f"![{content.stem}]({content.relative_to(out_dir).as_posix()})", ""]
        elif kind == "link":
            lines += [
                f"All experiments in one grid: [{content.name}]({content.relative_to(out_dir).as_posix()})",
                "",
            ]
        else:
            header, rows = content
            lines.append("| " + " | ".join(cell(h) for h in header) + " |")
            lines.append("|" + "---|" * len(header))
            lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
            lines.append("")
    return "\n".join(lines)


CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;padding:0 1em;max-width:1200px;color:#222}
.scroll{max-width:100%;overflow-x:auto}
table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:0.85em}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top;overflow-wrap:normal;
word-break:normal;hyphens:none}
th{background:#f3f3f3;white-space:nowrap}.nb{white-space:nowrap}td.PASS{color:#176f2c;font-weight:bold}td.FAIL{color:#b00020;font-weight:bold}
td.SKIP{color:#8a6d00}img{max-width:100%;height:auto;border:1px solid #eee;margin:0.5em 0}
figure{margin:1em 0;max-width:100%}figcaption{font-size:0.85em;color:#555}
p.why{background:#f6f8fa;border-left:3px solid #4a78b0;padding:0.5em 0.8em}
nav ul{columns:2;font-size:0.9em}"""


_NUMBER_LIKE = re.compile(r"\S*[\d-]\S*")  # 2.7e-09, [6e-05, n=64, E1-a: a browser breaks these at "-"


def _words(text: Any) -> str:
    """``text`` escaped for HTML, each word holding a digit or a hyphen kept on one line."""
    return _NUMBER_LIKE.sub(lambda m: f'<span class="nb">{m.group(0)}</span>', html.escape(str(text)))


def _embedded_png(path: Path) -> str:
    """The PNG at ``path`` as base64, with a 256-colour palette (a few times smaller than true
    colour; the figures are flat colours on white): as it is when it has one (what
    :func:`attnflow.viz.plotting.save_figure` writes), else re-encoded."""
    from PIL import Image

    with Image.open(path) as image:
        if image.mode == "P":
            return base64.b64encode(path.read_bytes()).decode("ascii")
        palette = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
        buffer = io.BytesIO()
        palette.save(buffer, format="PNG", optimize=True)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def html_page(blocks: list[tuple[str, Any]], out_dir: Path) -> str:
    esc = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             "<title>attnflow reproduce</title>", f"<style>{CSS}</style></head><body>"]  # fmt: skip
    for kind, content in blocks:
        if kind == "h1":
            parts.append(f"<h1>{esc(content)}</h1>")
        elif kind == "h2":
            parts.append(f'<h2 id="{esc(content[0])}">{esc(content[1])}</h2>')
        elif kind == "toc":
            items = "".join(f'<li><a href="#{esc(a)}">{esc(t)}</a></li>' for a, t in content)
            parts.append(f'<nav id="contents"><h2>Contents</h2><ul>{items}</ul></nav>')
        elif kind == "p":
            parts.append(f"<p>{esc(content)}</p>")
        elif kind == "why":
            parts.append(f'<p class="why"><strong>Why it matters.</strong> {esc(content)}</p>')
        elif kind == "img":
            data, caption = _embedded_png(content), esc(_caption(content))
            parts.append(f'<figure><img alt="{esc(content.stem)}" src="data:image/png;base64,{data}">'
                         f"<figcaption>{caption}</figcaption></figure>")  # fmt: skip
        elif kind == "link":
            href = esc(content.relative_to(out_dir).as_posix())
            parts.append(f'<p>All experiments in one grid (not embedded): <a href="{href}">{href}</a></p>')
        else:
            header, rows = content
            parts.append(
                '<div class="scroll"><table><tr>' + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>"
            )
            for row in rows:
                cells = "".join(
                    f'<td class="{c}">{esc(c)}</td>'
                    if c in ("PASS", "FAIL", "SKIP")
                    else f"<td>{_words(c)}</td>"
                    for c in row
                )
                parts.append(f"<tr>{cells}</tr>")
            parts.append("</table></div>")
    parts.append("</body></html>")
    return "\n".join(parts)


CAPTIONS = {
    "final_states": "The content at the end of each run, coloured by the label: the shapes at a glance.",
    "mean_cosine": "Mean cosine over time, one panel per experiment, each to its own horizon.",
    "energy": "Energy over time, one panel per experiment: the relative gap (E_max − E)/E_max on a log "
    "axis where the closed-form maximum E_max is known, the energy E otherwise.",
    "metastability": "Clusters in the gauge frame per seed, and the energy staircase in rescaled time.",
    "realisation_orbit": "Relative angles: the target law against the realised ones.",
    "realisation_sphere": "Target points g(ξ_i) and realised points, coloured by token index.",
}


def _caption(path: Path) -> str:
    if path.stem in CAPTIONS:
        return CAPTIONS[path.stem]
    return (f"{path.stem}: each variant's first seed at the largest n; content and gauge frame at τ = 0 "
            "and at the experiment's horizon; the colour bar names the label.")  # fmt: skip
