"""``attnflow sweep``, ``phase`` and ``landscape``: parameter grids, phase diagrams, stationary states."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnflow.cli import interrupts
from attnflow.cli.app import (
    EXIT_UNFINISHED,
    SET,
    Command,
    ConfigCommand,
    app,
    disk_failures,
    user_errors,
)
from attnflow.cli.arguments import (
    MAX_STARTS,
    MAX_WORKERS,
    check_grid_size,
    continuation_text,
    count_between,
    grid_texts,
)
from attnflow.cli.console import print_summary, say, stdout
from attnflow.cli.progress import progress_report
from attnflow.io.run_folder import LANDSCAPE, check_claim, check_out_folder


@app.command(cls=ConfigCommand)
def sweep(
    config: Annotated[Path, typer.Argument(metavar="CONFIG", help="Base TOML config file.")],
    grid: Annotated[
        list[str],
        typer.Option(
            "--grid",
            metavar="KEY=V1,V2,...",
            help="Axis key=v1,v2,... (repeat for a Cartesian product); lists in brackets: "
            "gauge.frequencies='[1.0],[0.5,0.25]'.",
        ),
    ],
    out: Annotated[
        Path, typer.Option(metavar="DIR", help="Sweep folder (runs/<hash>/, results.parquet, results.csv).")
    ],
    set_: Annotated[
        list[str], typer.Option("--set", metavar=SET, help="Override of the base, e.g. model.n=128.")
    ] = [],  # noqa: B006
    scheduler: Annotated[
        str | None,
        typer.Option(
            metavar="ADDRESS",
            help="Existing Dask scheduler: tcp://host:port, tls://host:port or a scheduler file. A "
            "scheduler is trusted with code execution: it runs code as you and its results are "
            "unpickled here, so use only one you control. (Without it, a local cluster with private "
            "TLS credentials.)",
        ),
    ] = None,
    tls_ca_file: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="With --scheduler: the CA file of the cluster's TLS certificates."),
    ] = None,
    tls_cert: Annotated[
        Path | None, typer.Option(metavar="FILE", help="With --scheduler: this client's TLS certificate.")
    ] = None,
    tls_key: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="With --scheduler: the key of --tls-cert (if not in that file)."),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            callback=count_between(1, MAX_WORKERS),
            metavar="N",
            help="Local worker processes (default: 1 per core).",
        ),
    ] = None,
    yes: Annotated[
        bool, typer.Option("--yes", metavar="", help="Run a grid of more than 1000 points.")
    ] = False,
) -> None:
    """Run a resumable Cartesian sweep on Dask distributed (finished points are skipped)."""
    with user_errors():  # the inputs first, before JAX and Dask are imported
        from attnflow.io.config import load_config
        from attnflow.workflows.sweep_plan import MAX_POINTS, parse_grid, plan_sweep

        check_out_folder(out)
        axes = [parse_grid(spec) for spec in grid_texts(grid)]
        if yes:
            check_grid_size([len(axis.values) for axis in axes])
        plan = plan_sweep(load_config(config, set_), axes, max_points=None if yes else MAX_POINTS)
    from attnflow.workflows.sweep import TlsFiles, check_scheduler, run_sweep

    with user_errors():
        tls = None
        if tls_ca_file is not None or tls_cert is not None or tls_key is not None:
            if tls_ca_file is None or tls_cert is None:
                named = zip(
                    ("--tls-ca-file", "--tls-cert", "--tls-key"),
                    (tls_ca_file, tls_cert, tls_key),
                    strict=True,
                )
                given = " and ".join(option for option, path in named if path is not None)
                raise ValueError(
                    f"sweep: `--tls-ca-file` and `--tls-cert` must be given together; got only {given}."
                )
            tls = TlsFiles(ca_file=tls_ca_file, cert=tls_cert, key=tls_key)
        if scheduler is not None:
            check_scheduler(scheduler)
        kept = "every finished point (a second run skips them)"
        interrupts.on_stop(kept=f"{str(out)!r} keeps every finished point; the same command continues "
                           "(finished points are skipped).")  # fmt: skip
        with disk_failures(out, kept=kept), progress_report("sweep", "simulating", "points") as report:
            progress = interrupts.checked(report)
            summary = run_sweep(plan, out, scheduler=scheduler, workers=workers, progress=progress, tls=tls)
    for message, count in summary.warnings.items():
        say(f"warning ({count} points): {message}")
    for digest, error in summary.failures.items():
        say(f"failed {digest}: {error}")
    rows = {"points": summary.points, "done": summary.done, "skipped": summary.skipped}
    rows.update(failed=summary.failed, wall_time_s=summary.wall_time_s, results=str(summary.results))
    print_summary(f"attnflow sweep {config.name}", rows)
    if summary.failed:
        say(f"error: {summary.failed} of {summary.points} points did not finish (their folders say why).")
        raise typer.Exit(code=EXIT_UNFINISHED)


@app.command(cls=Command)
def phase(
    sweep_dir: Annotated[
        Path, typer.Argument(metavar="SWEEP_DIR", help="A sweep folder (with results.parquet).")
    ],
    x: Annotated[str, typer.Option("--x", metavar="KEY", help="Column on the x axis, e.g. model.beta.")],
    y: Annotated[str, typer.Option("--y", metavar="KEY", help="Column on the y axis, e.g. model.n.")],
    metric: Annotated[
        str,
        typer.Option(
            metavar="METRIC",
            help="Column (mean per cell; text: most frequent) or NAME OP VALUE, the share of rows "
            "where it holds: n_clusters>=2, shape==arc, gradient_flow==true (booleans: true or false; "
            "True, False accepted). VALUE must fit the column's type (text and booleans: == or != "
            "only). A missing value (collapse_time of a run that never collapsed) satisfies no "
            "comparison; failed points are left out.",
        ),
    ],
    out: Annotated[
        Path | None, typer.Option(metavar="FILE", help="A .png (default DIR/figures/phase_<metric>.png).")
    ] = None,
    title: Annotated[str | None, typer.Option(metavar="TEXT", help="Figure title.")] = None,
) -> None:
    """Draw a phase diagram of a sweep: a metric over two grid keys, averaged over the others."""
    from attnflow.viz.phase import write_phase_figure

    with user_errors():
        path = write_phase_figure(sweep_dir, x, y, metric, out, title=title)
    stdout.print(str(path))


@app.command(cls=ConfigCommand)
def landscape(
    config: Annotated[
        Path,
        typer.Argument(metavar="CONFIG", help="TOML config file (its kernel; its solver flows the starts)."),
    ],
    out: Annotated[
        Path, typer.Option(metavar="DIR", help="Folder: states.csv, states.npz, landscape.json (+ branches).")
    ],
    set_: Annotated[list[str], typer.Option("--set", metavar=SET, help="Override, e.g. model.beta=3.")] = [],  # noqa: B006
    starts: Annotated[
        int,
        typer.Option(
            callback=count_between(0, MAX_STARTS),
            metavar="N",
            help="Random starts besides the closed-form candidates.",
        ),
    ] = 8,
    continue_: Annotated[
        str | None,
        typer.Option(
            "--continue",
            metavar="KEY=START:STOP:STEP",
            help="Follow every state in a parameter: beta=0.5:5:0.1.",
        ),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", metavar="", help="Replace the landscape in --out.")
    ] = False,
) -> None:
    """Find the stationary states of the energy (Newton), their Morse index (Lanczos), branches."""
    with user_errors():  # the inputs first, before JAX is imported
        from attnflow.io.config import load_config, override_keys

        continuation_text(continue_)
        cfg = load_config(config, set_)
        check_claim(check_out_folder(out), LANDSCAPE, overwrite=overwrite)
    from attnflow.workflows.landscape import check_gradient_flow, parse_continuation, run_landscape

    with user_errors():
        check_gradient_flow(cfg, where=str(config), overridden=override_keys(set_))
        continuation = None if continue_ is None else parse_continuation(continue_)
        with disk_failures(out), progress_report("landscape", "solving", "starts") as report:
            result = run_landscape(
                cfg, out, starts=starts, continuation=continuation, overwrite=overwrite,
                progress=interrupts.checked(report),
            )  # fmt: skip
    best = result.states[0] if result.states else None
    rows = {"states": len(result.states), "starts": len(result.starts)}
    if best is not None:
        rows.update(best_energy=best.energy, best_index=best.morse_index, best_shape=best.shape)
    rows.update(
        {f"transition {t['branch']}": t[continuation.key] for t in result.transitions} if continue_ else {}
    )
    rows.update(folder=str(out))
    print_summary(f"attnflow landscape {config.name}", rows)
