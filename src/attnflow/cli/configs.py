"""``attnflow config show`` and ``attnflow config check``: a config as it will run, without running it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnflow.cli.app import SET, ConfigCommand, Group, app, user_errors
from attnflow.cli.console import print_summary, stdout

config_app = typer.Typer(
    cls=Group,
    name="config",
    help="Show a config with every default filled in, or check it (memory, time) without running it.",
    no_args_is_help=True,
)
app.add_typer(config_app)

CONFIG = Annotated[Path, typer.Argument(metavar="CONFIG", help="TOML config file.")]
SETS = Annotated[list[str], typer.Option("--set", metavar=SET, help="Override, e.g. model.n=128.")]

# multiply-adds per second per core assumed by the time estimate: an order of magnitude, not a
# measurement (a run's own wall time is in its metrics.json)
ASSUMED_RATE = 2e9
STAGES = {"euler": 1, "rk4": 4, "geodesic_rk4": 4}  # field evaluations per fixed step


@config_app.command(cls=ConfigCommand)
def show(config: CONFIG, set_: SETS = []) -> None:  # noqa: B006
    """Print the resolved config (TOML, every default filled in): what `attnflow run` would run."""
    with user_errors():
        from attnflow.io.config_load import load_config, resolved_toml

        text = resolved_toml(load_config(config, set_))
    stdout.print(text, end="", markup=False, highlight=False, soft_wrap=True)


def _steps(solver) -> int | None:
    """The steps of a fixed-step run (None for an adaptive one: its steps are not known before)."""
    if solver.method == "adaptive":
        return None
    return round(solver.t_end / solver.dt)  # a whole number of steps (config rules)


@config_app.command(cls=ConfigCommand)
def check(config: CONFIG, set_: SETS = []) -> None:  # noqa: B006
    """Validate a config and estimate its memory and time without running it (exit 2 if refused).

    The checks are those of `attnflow run`, the files the config names included."""
    with user_errors():
        from attnflow.io.config_load import config_hash, load_config

        cfg = load_config(config, set_)
        rows = {"config": "valid", "hash": config_hash(cfg)}
        rows.update(_particle_rows(cfg) if cfg.density is None else _density_rows(cfg))
    print_summary(f"attnflow config check {config.name}", rows)


def _memory(total: int) -> str:
    from attnflow.workflows.build import physical_memory

    return f"about {total / 2**20:.3g} MiB at most ({physical_memory() / 2**30:.3g} GiB here)"


def _particle_rows(cfg) -> dict:
    """A particle run, built as `attnflow run` builds it (every input and its memory bound checked;
    nothing runs), with an order-of-magnitude time of its exact sums."""
    from attnflow.numerics.expansion import exact_cost
    from attnflow.numerics.saving import snapshot_count
    from attnflow.workflows.build import build, check_memory, memory_estimate

    check_memory(cfg, streamed=True)  # as `attnflow run` holds it; refused in one line
    memory = sum(memory_estimate(cfg, streamed=True).values())
    build(cfg, streamed=True)  # the library's own checks (input files, gauges, factors): nothing runs
    solver, model = cfg.solver, cfg.model
    steps = _steps(solver)
    rows = {"n": model.n, "d": model.d, "snapshots": snapshot_count(solver.t_end, solver.save_every)}
    rows["memory"] = _memory(memory)
    if steps is None:
        rows["steps"] = f"adaptive (bound: {solver.max_steps or 'none'} steps; at most 10^6 per snapshot)"
        rows["time"] = "not known before the run: the adaptive solver chooses its steps"
    else:
        work = steps * STAGES[solver.method] * exact_cost(model.n, model.d)
        rows["steps"] = steps
        rows["time"] = (
            f"about {work / ASSUMED_RATE:.2g} s on one core of the exact sums at an assumed "
            f"{ASSUMED_RATE:.0e} multiply-adds per second (an order of magnitude; plus start-up "
            "and compilation)"
        )
    return rows


def _density_rows(cfg) -> dict:
    """A density run, built as `attnflow run` builds it (every input and its memory bound checked;
    a small resolution check compiled, no step taken); its time is not estimated."""
    from attnflow.core.kernel import make_profile
    from attnflow.workflows.density_build import build_density, memory_estimate

    run = build_density(cfg)
    model, density = cfg.model, cfg.density
    profile = make_profile(model.profile, beta=model.beta, time_scale=model.time_scale)
    domain = f"S^1, grid {density.grid}" if run.domain == "circle" else f"S^2, lmax {density.lmax}"
    return {
        "domain": domain,
        "labels": run.labels.size,
        "snapshots": run.snapshots,
        "memory": _memory(sum(memory_estimate(cfg, profile, run.labels.size).values())),
        "steps": run.snapshots * run.steps_per_snapshot - run.steps_per_snapshot,
        "time": "not estimated for a density run (its cost is the grid's and lmax's, not n^2)",
    }
