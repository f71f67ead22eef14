"""The ``attnflow`` command line (SPEC §7.1). Each command body is a few lines over the library.

Bad input (a ``ValueError``, ``ConfigError`` included) becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

app = typer.Typer(
    name="attnflow",
    help="Mean-field self-attention dynamics with frozen auxiliary variables.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
stderr = Console(stderr=True)
stdout = Console()


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn bad input into one line on stderr and exit code 2."""
    try:
        yield
    except (ValueError, TypeError, FileNotFoundError) as error:
        stderr.print(f"error: {error}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(code=2) from None


@contextlib.contextmanager
def progress_bar(description: str) -> Iterator:
    """A rich progress bar on a terminal; a no-op callback otherwise."""
    if not stderr.is_terminal:
        yield lambda done, total: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"))
    with Progress(*columns, TimeElapsedColumn(), console=stderr, transient=True) as bar:
        task = bar.add_task(description, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def print_summary(title: str, rows: dict) -> None:
    table = Table(title=title, show_header=False)
    for key, value in rows.items():
        table.add_row(key, f"{value:.6g}" if isinstance(value, float) else str(value))
    stdout.print(table)


SUMMARY_KEYS = (
    "energy", "energy_gap", "mean_cosine", "gauge_mean_cosine", "n_clusters", "n_eff",
    "orbit_residual", "planarity", "collapse_time", "gauge_collapse_time", "energy_monotone",
)  # fmt: skip


@app.command()
def run(
    config: Annotated[Path, typer.Argument(help="TOML config (SPEC §7.2).")],
    set_: Annotated[list[str], typer.Option("--set", help="Override, e.g. model.n=128.")] = [],  # noqa: B006
    out: Annotated[Path | None, typer.Option(help="Run folder (default runs/<config hash>).")] = None,
) -> None:
    """Run one simulation and write its run folder."""
    from attnflow.config import config_hash, load_config
    from attnflow.run import run as run_simulation

    with user_errors():
        cfg = load_config(config, set_)
        out = out if out is not None else Path("runs") / config_hash(cfg)
        with progress_bar("simulating") as progress:
            result = run_simulation(cfg, out, progress=progress)
    info = result.metrics["run"]
    rows = {k: result.metrics.get(k) for k in SUMMARY_KEYS}
    rows.update(status=info["status"], steps=info["steps"], wall_time_s=info["wall_time_s"], folder=str(out))
    print_summary(f"attnflow run {config.name}", rows)


@app.command()
def plot(run_dir: Annotated[Path, typer.Argument(help="A run folder.")]) -> None:
    """Redraw the figures of a run folder from its stored trajectory."""
    from attnflow.run import replot

    with user_errors():
        paths = replot(run_dir)
    for path in paths:
        stdout.print(str(path))


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
