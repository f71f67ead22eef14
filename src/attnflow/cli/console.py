"""The command line's output: results on stdout, messages and progress on stderr, one plain line each."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

stderr = Console(stderr=True, emoji=False)  # ":b:" in a value given is text, not an emoji
stdout = Console(emoji=False)


def say(line: str) -> None:
    """One plain line on stderr (no markup, no wrapping)."""
    stderr.print(line, markup=False, highlight=False, soft_wrap=True)


def shown(value) -> str:
    """A summary value as a reader wants it: floats to 6 digits, an undefined value as "—"."""
    if value is None:
        return "—"
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def print_summary(title: str, rows: dict) -> None:
    table = Table(title=title, show_header=False)
    for key, value in rows.items():
        table.add_row(key, shown(value))
    stdout.print(table)
