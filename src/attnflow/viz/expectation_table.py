"""Expectation rows as text, and the reproduction's table generated from ``results.json``: every
row, none chosen.

``markdown_table(results)`` has one line per expectation and variant, the sizes side by side;
``write_table`` writes it as ``table.md`` beside the report. ``python -m attnflow.viz.expectation_table
RESULTS_JSON README.md`` writes it into ``docs/figures/reproduce_table.md`` beside the README (the
docs' experiment pages show its rows) and replaces the block between ``<!-- reproduce-table -->``
and ``<!-- /reproduce-table -->`` of the README with its summary line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from attnflow.io.atomic import write_text

OP_TEXT = {"<": "<", "<=": "≤", ">": ">", ">=": "≥", "==": "=", "~=": "≈", "in": "in"}


# --------------------------------------------------------------------------- formatting


def fmt(value: Any) -> str:
    """A short human form of a measured value."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"n={k}: {fmt(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    return str(value)


def bound_text(row: dict[str, Any]) -> str:
    """``≤ 0.0001``, ``median in [5, 11]``, ``≥ 2 for ≥ 2 seeds``, ``≤ ks_bound + 1e-06``, ..."""
    op, bound, tol = OP_TEXT[row["op"]], row["bound"], row["tol"]
    text = f"{op} {fmt(bound)}"
    if row["op"] == "~=" and tol:
        text += f" ± {tol:g}"
    elif isinstance(bound, str) and tol:
        text += f" + {tol:g}"
    if row["scope"] == "count":
        return f"{text} for ≥ {row['min_count']} seeds"
    return text if row["scope"] == "every seed" else f"{row['scope']} {text}"


def measured_text(row: dict[str, Any]) -> str:
    value = fmt(row["measured"])
    if row["scope"] == "every seed" and row["op"] == "~=":
        value = f"max |value − {fmt(row['bound'])}| = {value}"
    elif row["scope"] == "every seed" and isinstance(row["bound"], str) and row["op"] in ("<", "<="):
        value = f"max(value − {row['bound']}) = {value}"
    if row["scope"] == "count":
        value = f"{value} seeds" if not isinstance(row["measured"], dict) else value
    if row.get("failing_seeds"):
        value += f" (failing seeds {row['failing_seeds']})"
    if row.get("note"):
        value += f" — {row['note']}"
    return value


START, END = "<!-- reproduce-table -->", "<!-- /reproduce-table -->"
HEADER = "| id | expectation | expected | measured (per n) | status |\n|---|---|---|---|---|"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _measured(rows: list[dict[str, Any]]) -> str:
    if len(rows) == 1:
        row = rows[0]
        if row["n"] == "some":  # one row for all sizes
            return measured_text(row)
        return f"n={row['n']}: {measured_text(row)}"
    return " / ".join(f"n={row['n']}: {measured_text(row)}" for row in rows)


def _status(rows: list[dict[str, Any]]) -> str:
    statuses = {row["status"] for row in rows}
    return "FAIL" if "FAIL" in statuses else ("SKIP" if statuses == {"SKIP"} else "PASS")


def table_rows(results: dict[str, Any]) -> list[list[str]]:
    """One row per (experiment, expectation, variant): id, text, bound, measured per size, status."""
    lines = []
    for eid, experiment in results["experiments"].items():
        groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
        for row in experiment["expectations"]:
            groups.setdefault((row["index"], row["variant"]), []).append(row)
        for (_, variant), rows in groups.items():
            text = f"{variant}: {rows[0]['text']}" if variant else rows[0]["text"]
            lines.append([eid, text, bound_text(rows[0]), _measured(rows), _status(rows)])
    return lines


def markdown_table(results: dict[str, Any]) -> str:
    counts = results["counts"]
    head = (
        f"{counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP"
        f" ({'quick' if results['quick'] else 'full'} run, attnflow {results['attnflow_version']},"
        f" wall time {fmt(results['wall_time_s'])} s)"
    )
    body = "\n".join("| " + " | ".join(_cell(c) for c in line) + " |" for line in table_rows(results))
    return f"{head}\n\n{HEADER}\n{body}\n"


def write_table(out_dir: Path, results: dict[str, Any]) -> Path:
    path = out_dir / "table.md"
    write_text(path, markdown_table(results))
    return path


def replace_block(text: str, table: str) -> str:
    """``text`` with the part between the markers replaced by ``table``."""
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"expectation_table: the text must hold {START} ... {END}; it does not.")
    return text[: start + len(START)] + "\n" + table + text[end:]


TABLE_PAGE = Path("docs") / "figures" / "reproduce_table.md"  # beside the README: the docs' copy


def summary_block(results: dict[str, Any]) -> str:
    """What the README holds between the markers: the run's summary line and where its table is."""
    head = markdown_table(results).splitlines()[0]
    return (
        f"{head}\n\nEvery row, with the measured value per size, is on each experiment's page of the "
        f"docs (Experiments) and in `{TABLE_PAGE.as_posix()}`.\n"
    )


def main(argv: list[str]) -> None:
    """``RESULTS_JSON README_MD``: the full table into ``docs/figures/reproduce_table.md`` beside
    the README (the docs' experiment pages show its rows), and its summary line into the README."""
    if len(argv) != 2:
        raise SystemExit("usage: python -m attnflow.viz.expectation_table RESULTS_JSON README_MD")
    results = json.loads(Path(argv[0]).read_text())
    readme = Path(argv[1])
    (readme.parent / TABLE_PAGE).parent.mkdir(parents=True, exist_ok=True)
    write_text(readme.parent / TABLE_PAGE, markdown_table(results))
    readme.write_text(replace_block(readme.read_text(), summary_block(results)))


if __name__ == "__main__":
    main(sys.argv[1:])
