"""``attnflow reproduce`` (the paper's experiments and their report) and ``attnflow realize``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnflow.cli import interrupts
from attnflow.cli.app import (
    EXIT_EXPECTATION_FAILED,
    SEED_MAX,
    SET,
    Command,
    app,
    disk_failures,
    exit_unless_ok,
    user_errors,
)
from attnflow.cli.arguments import (
    MAX_REALIZE_T_END,
    MAX_SEEDS,
    MAX_TOKENS,
    MAX_WORKERS,
    at_most,
    count_between,
    only_text,
    positive_at_most,
    sizes_text,
)
from attnflow.cli.console import print_summary, say, stdout
from attnflow.cli.progress import job_stages, progress_report
from attnflow.io.arrays import ArrayFileError, check_array_file
from attnflow.io.cache_folder import check_cache_folder
from attnflow.io.run_folder import REALIZE, check_claim, check_out_folder


@app.command(cls=Command)
def reproduce(
    quick: Annotated[
        bool, typer.Option("--quick", metavar="", help="Fewer sizes and seeds (what CI runs).")
    ] = False,
    only: Annotated[
        str | None, typer.Option(metavar="IDS", help="Comma-separated experiment ids, e.g. E1,E3.")
    ] = None,
    out: Annotated[Path, typer.Option(metavar="DIR", help="Report folder.")] = Path("results/reproduce"),
    sizes: Annotated[
        str | None,
        typer.Option(
            metavar="N,N,...",
            help="Token counts that replace each experiment's own, e.g. --only E3 --sizes 512,1024.",
        ),
    ] = None,
    seeds: Annotated[
        int | None,
        typer.Option(
            callback=count_between(1, MAX_SEEDS),
            metavar="K",
            help="Seeds 0..K-1 instead of each experiment's own.",
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            callback=count_between(1, MAX_WORKERS),
            metavar="N",
            help="Processes that run the jobs (default: 1 with --quick, else one per core, at most 2).",
        ),
    ] = None,
    set_: Annotated[
        list[str],
        typer.Option(
            "--set",
            metavar=SET,
            help="Override of every simulated run, e.g. solver.interaction=expansion (repeatable).",
        ),
    ] = [],  # noqa: B006
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            metavar="",
            help="Continue the reproduce run in --out (same settings): run only the experiments "
            "it has not finished, then write the report over all of them.",
        ),
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite", metavar="", help="Replace the reproduce run in --out (removes only its files)."
        ),
    ] = False,
) -> None:
    """Run the experiments (the paper's E0-E9 and E10-E17 beyond it), check every expectation, write
    the report."""
    with user_errors():  # the option strings and the cache folder, before the library is imported
        only_text(only), sizes_text(sizes)
        check_cache_folder()
    from attnflow.io.config import apply_overrides
    from attnflow.io.reproduce_folder import make_settings
    from attnflow.numerics.program_cache import enable_persistent_cache
    from attnflow.viz.report import failure_lines, summary_table
    from attnflow.workflows.experiments import load_experiments
    from attnflow.workflows.reproduce import reproduce as run_reproduce
    from attnflow.workflows.reproduce import resume_command
    from attnflow.workflows.reproduce_plan import parse_only, parse_sizes, plan

    with user_errors():
        enable_persistent_cache()  # a cache folder another user could write: one line, exit 2
        ids, token_counts = parse_only(only), parse_sizes(sizes)
        overrides = apply_overrides({}, set_)  # malformed --set values, before any experiment is read
        _refuse_other_layer_norms(overrides)
        jobs = plan(load_experiments(ids), quick=quick, sizes=token_counts, n_seeds=seeds, overrides=set_)
        refuse_unread_overrides(set_, simulation_configs(jobs, set_))  # as a key a config's kind ignores
        check_out_folder(out)
        settings = make_settings(quick=quick, sizes=token_counts, n_seeds=seeds, overrides=set_)
        interrupts.on_stop(continues=f"`{resume_command(out, settings, ids)}` continues")
        with (
            disk_failures(out, kept="every experiment it finished (--resume continues)"),
            progress_report("reproduce", "compiling", "snapshots") as report,
        ):
            options = dict(quick=quick, only=ids, sizes=token_counts, n_seeds=seeds, workers=workers)
            options.update(overrides=tuple(set_), resume=resume, overwrite=overwrite)
            progress = interrupts.checked(job_stages(report))
            outcome = run_reproduce(out, **options, progress=progress, on_stage=report.stage)
    stdout.print(summary_table(outcome))
    for line in failure_lines(outcome):
        say(line)
    stdout.print(f"report: {out / 'report.html'}")
    if outcome.failures:
        raise typer.Exit(code=EXIT_EXPECTATION_FAILED)


@app.command(cls=Command)
def realize(
    target: Annotated[
        Path, typer.Option(metavar="FILE", help="Target (.npy): sphere (n,d) unit rows; orbit (n,) angles.")
    ],
    kind: Annotated[
        str,
        typer.Option(
            metavar="sphere|orbit", help="'sphere' (gauge-level realisation) or 'orbit' (one RoPE orbit)."
        ),
    ],
    n: Annotated[
        int | None,
        typer.Option(
            callback=at_most(MAX_TOKENS),
            metavar="N",
            help="Tokens (orbit: default the sample count).",
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(metavar="DIR", help="Run folder (default runs/realize-<kind>-<name>).")
    ] = None,
    seed: Annotated[
        int,
        typer.Option(callback=count_between(0, SEED_MAX), metavar="SEED", help="Seed of the initial data."),
    ] = 0,
    t_end: Annotated[
        float,
        typer.Option(
            callback=positive_at_most(MAX_REALIZE_T_END, "at most 1e8 steps of dt = 0.01"),
            metavar="TAU",
            help="Final time τ (> 0).",
        ),
    ] = 40.0,
    mode: Annotated[
        str,
        typer.Option(
            metavar="a-priori|exact",
            help="'a-priori' (gauges fixed before the run) or 'exact' (the gauge frame simulated "
            "first, the gauges chosen from the consensus it reaches: realised to round-off).",
        ),
    ] = "a-priori",
    overwrite: Annotated[
        bool, typer.Option("--overwrite", metavar="", help="Replace the realisation in --out.")
    ] = False,
) -> None:
    """Realise a target law: build the gauge, run the dynamics, write the run folder."""
    with user_errors():  # the cache folder and the target file, before JAX is imported
        check_cache_folder()
        try:
            check_array_file(target)
        except ArrayFileError as error:
            raise ValueError(f"realize: `--target` {error}.") from None
        out = check_out_folder(out if out is not None else Path("runs") / f"realize-{kind}-{target.stem}")
        check_claim(out, REALIZE, overwrite=overwrite)
    from attnflow.numerics.program_cache import enable_persistent_cache
    from attnflow.workflows.realize import SUMMARY_KEYS as REALIZE_KEYS
    from attnflow.workflows.realize import run_realisation

    with user_errors():
        enable_persistent_cache()  # a cache folder another user could write: one line, exit 2
        with (
            disk_failures(out, kept="every completed snapshot"),
            progress_report("realize", "simulating", "snapshots") as bar,
        ):
            interrupts.on_stop(
                kept=f"{str(out)!r} keeps the snapshots computed so far (--overwrite runs it again)"
            )
            options = dict(n=n, out=out, seed=seed, t_end=t_end, mode=mode, overwrite=overwrite)
            result = run_realisation(target, kind=kind, **options, progress=interrupts.checked(bar))
    rows = {k: result.get(k) for k in REALIZE_KEYS}
    rows.update(status=result["run"]["status"], wall_time_s=result["run"]["wall_time_s"], folder=str(out))
    print_summary(f"attnflow realize --kind {kind} {target.name}", rows)
    exit_unless_ok(result["run"]["status"], out)


def _refuse_other_layer_norms(overrides: dict) -> None:
    """Each experiment's expectations are for the layer norm its file sets (post-LN but in E15):
    another one given with --set is refused before any experiment starts (not once per experiment
    as a failed row)."""
    from attnflow.io.config_errors import ConfigError

    layer_norm = overrides.get("model", {}).get("layer_norm", "post")
    if layer_norm != "post":
        raise ConfigError.from_parts(
            "model.layer_norm",
            "'post' in reproduce (each experiment fixes its own layer norm: E15 runs all four; "
            "`attnflow run` and `attnflow sweep` run any)",
            layer_norm,
            where="--set",
        )


def simulation_configs(jobs: list, overrides: list[str]) -> list:
    """The configs of the simulations among ``jobs``; a bad value given by ``--set`` is refused
    naming ``--set``, not the experiment's file (as ``attnflow run`` does)."""
    from attnflow.io.config import ConfigError, override_keys

    given = override_keys(overrides)
    try:
        return [job.simulation_config() for job in jobs if job.experiment.kind == "simulate"]
    except ConfigError as error:
        raise (error.at("--set") if error.key in given else error) from None


def refuse_unread_overrides(overrides: list[str], configs: list) -> None:
    """A ``--set`` key that no simulation of the run reads (each one's chosen kind ignores it, as
    ``solver.atol`` when every simulation steps with rk4) is refused as in a config file, naming
    the first simulation's kind; one that some simulation reads is kept (the experiments choose
    different kinds)."""
    from attnflow.io.config import apply_overrides
    from attnflow.io.config_errors import ConfigError
    from attnflow.io.config_unused import check_unused

    for override in overrides:
        data = apply_overrides({}, [override])
        key = override.partition("=")[0].strip()
        refusals = []
        for config in configs:
            try:
                check_unused(data, config, where="--set", overridden=[key])
            except ConfigError as refusal:
                refusals.append(refusal)
            else:
                break  # read by this simulation
        if configs and len(refusals) == len(configs):
            raise refusals[0]
