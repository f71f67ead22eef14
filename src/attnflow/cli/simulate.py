"""``attnflow run``, ``plot`` and ``animate``: one simulation, its figures, its motion."""

from __future__ import annotations

import re
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
    disk_failure,
    exit_unless_ok,
    user_errors,
)
from attnflow.cli.arguments import MAX_FPS, MAX_FRAMES, MAX_SHOWN_TOKENS, count_between
from attnflow.cli.console import print_summary, say, stdout
from attnflow.cli.progress import progress_report, snapshot_stages
from attnflow.io.cache_folder import check_cache_folder
from attnflow.io.run_folder import RUN, check_claim, check_out_folder

SUMMARY_KEYS = (
    "energy", "energy_gap", "mean_cosine", "gauge_mean_cosine", "shape", "gauge_shape", "n_clusters", "n_eff",
    "orbit_residual", "planarity", "collapse_time", "gauge_collapse_time", "energy_monotone",
)  # fmt: skip
RADIUS_KEYS = ("radius_mean", "radius_max")  # pre- and peri-LN runs, whose tokens carry a radius


def _refuse_an_earlier_run_of_this_config(out: Path, *, resume: bool, overwrite: bool) -> None:
    """The default folder ``runs/<config hash>`` already holds a run: the same config ran before."""
    if (out / RUN.marker).exists() and not (resume or overwrite):
        raise ValueError(
            f"run: the default `--out` {str(out)!r} (named after the config's hash) must be new; got the "
            "folder of an earlier run of this same config. Pass --resume to continue it, --overwrite "
            "to run it again, or --out DIR for another folder."
        )


@app.command(cls=ConfigCommand)
def run(
    config: Annotated[Path, typer.Argument(metavar="CONFIG", help="TOML config file.")],
    set_: Annotated[list[str], typer.Option("--set", metavar=SET, help="Override, e.g. model.n=128.")] = [],  # noqa: B006
    out: Annotated[
        Path | None, typer.Option(metavar="DIR", help="Run folder (default runs/<config hash>).")
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume", metavar="", help="Continue the run in --out from its last complete snapshot."
        ),
    ] = False,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", metavar="", help="Replace the run in --out.")
    ] = False,
) -> None:
    """Run one simulation and write its run folder."""
    with user_errors():  # the inputs first, before JAX is imported: a refusal costs no start-up
        check_cache_folder()
        from attnflow.io.config import config_hash, load_config, override_keys

        cfg = load_config(config, set_)
        if out is None:
            out = Path("runs") / config_hash(cfg)
            _refuse_an_earlier_run_of_this_config(out, resume=resume, overwrite=overwrite)
        out = check_out_folder(out)
        layout = RUN if cfg.density is None else _density_layout()  # a [density] section: density.zarr
        check_claim(out, layout, resume=resume, overwrite=overwrite)  # a run folder: checked before JAX
    if cfg.density is None:
        from attnflow.numerics.lanes import use_cpu_cores
        from attnflow.workflows.run import run as execute

        use_cpu_cores()  # large n: the tile lanes run on every core (results do not depend on it)
    else:  # the density instead of particles
        from attnflow.workflows.density_run import run_density as execute
    metrics = _executed(
        execute, cfg, config, out, resume=resume, overwrite=overwrite, overridden=override_keys(set_)
    )
    info = metrics["run"]
    if cfg.density is None:
        rows = {k: metrics.get(k) for k in SUMMARY_KEYS}
        rows.update({k: metrics[k] for k in RADIUS_KEYS if metrics.get(k) is not None})
        rows.update(status=info["status"], steps=info["steps"], wall_time_s=info["wall_time_s"])
        rows.update(folder=str(out), interaction=info.get("interaction"), rank=info.get("rank"))
        why = metrics.get("methods", {}).get("shape", "")
        for key in ("shape", "gauge_shape"):  # undefined off S^2: say so, and why
            if rows.get(key) is None and why.startswith("not classified: "):
                rows[key] = f"— ({why.removeprefix('not classified: ')})"
        clusters = re.search(  # d > 3: the cluster angle beside the spacing of uniform tokens
            r"theta_c = (\S+) rad.*nearest neighbours about (\S+) rad",
            metrics.get("methods", {}).get("n_clusters", ""),
        )
        if rows.get("n_clusters") is not None and clusters:
            angle, apart = clusters.groups()
            rows["n_clusters"] = (
                f"{rows['n_clusters']} (below {angle} rad; uniform tokens here are {apart} rad apart)"
            )
        title = f"attnflow run {config.name}"
    else:
        rows = {k: metrics.get(k) for k in DENSITY_KEYS}
        size = {"grid": info.get("grid")} if "grid" in info else {"lmax": info.get("lmax")}
        rows.update(size, labels=info["labels"], status=info["status"], steps=info["steps"])
        rows.update(wall_time_s=info["wall_time_s"], folder=str(out))
        title = f"attnflow run {config.name} (density)"
    print_summary(title, rows)
    exit_unless_ok(info["status"], out)


def _executed(
    execute, cfg, config: Path, out: Path, *, resume: bool, overwrite: bool, overridden: set[str]
) -> dict:
    """``execute`` (a particle or a density run) into ``out`` under the command line's policies:
    the compilation cache, Ctrl-C, progress, a disk that fails once the run started (exit 3), a
    config error found while building (a file of the wrong shape) named for the file or --set.
    Returns the run's metrics."""
    from attnflow.io.config import ConfigError
    from attnflow.numerics.program_cache import enable_persistent_cache

    with user_errors():  # a cache folder another user could write: one line, exit 2
        enable_persistent_cache()
    interrupts.on_stop(continues=f"metrics.json records status 'interrupted'. Continue with: attnflow run "
                       f"{config} --out {out} --resume")  # fmt: skip
    try:
        with user_errors(), progress_report("run", "building", "snapshots") as report:
            progress = interrupts.checked(snapshot_stages(report))
            try:
                result = execute(cfg, out, progress=progress, resume=resume, overwrite=overwrite)
            except ConfigError as error:
                if error.where != "config":  # already named
                    raise
                raise error.at("--set" if error.key in overridden else str(config)) from None
    except OSError as error:  # the disk failed the run once started; any other OSError is a bug
        if not disk_failure(error, out):
            raise
        say(f"error: {error.strerror} ({error.filename or out}); the run folder keeps every completed "
            "snapshot and records the status where the disk allowed.")  # fmt: skip
        raise typer.Exit(code=EXIT_UNFINISHED) from None
    return result.metrics


def _density_layout():
    from attnflow.io.density_folder import DENSITY_RUN

    return DENSITY_RUN


DENSITY_KEYS = ("energy", "energy_monotone", "mass_error", "spread", "slice_spread", "resolution_tail")


@app.command(cls=Command)
def plot(run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A run folder.")]) -> None:
    """Redraw the figures of a run folder from its stored trajectory (or density)."""
    from attnflow.workflows import density_run
    from attnflow.workflows import run as particle_run

    density = (run_dir / "density.zarr").exists() and not (run_dir / "trajectory.zarr").exists()
    with user_errors():
        paths = (density_run.replot if density else particle_run.replot)(run_dir)
    for path in paths:
        stdout.print(str(path))


@app.command(cls=Command)
def animate(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A run folder.")],
    out: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="The animation: .gif, or .mp4 where ffmpeg exists (default RUN_DIR/movie.gif).",
        ),
    ] = None,
    viewer_only: Annotated[
        bool, typer.Option("--viewer-only", metavar="", help="Write only viewer.html.")
    ] = False,
    fps: Annotated[
        int,
        typer.Option(
            callback=count_between(1, MAX_FPS), metavar="N", help="Frames per second of the animation."
        ),
    ] = 12,
    max_tokens: Annotated[
        int,
        typer.Option(
            callback=count_between(1, MAX_SHOWN_TOKENS), metavar="N", help="Tokens shown (an even subsample)."
        ),
    ] = 1000,
    max_frames: Annotated[
        int,
        typer.Option(
            callback=count_between(2, MAX_FRAMES),
            metavar="N",
            help="Snapshots shown (an even subsample, ends included).",
        ),
    ] = 100,
) -> None:
    """Animate a run: viewer.html (rotatable 3-D view with a time slider, offline) and a GIF/MP4 of
    the tokens moving, the content beside the gauge frame, coloured by the label."""
    from attnflow.workflows.animate import animate as write_motion

    with user_errors(), progress_report("animate", "drawing", "frames") as report:
        paths = write_motion(
            run_dir, out=out, viewer_only=viewer_only, fps=fps, max_tokens=max_tokens, max_frames=max_frames,
            progress=report,
        )  # fmt: skip
    for path in paths:
        stdout.print(str(path))
