"""The ``attnflow`` command line. Each command body is a few lines over the library.

Exit codes (``EXIT_CODES``): 0 done as asked; 1 ``reproduce`` ran but an expectation failed;
2 bad input (one line on stderr, nothing written); 3 a run started but did not finish as asked
(a non-finite state, a step limit, a failed sweep point: the run folder records why).
Bad input is a ``ValueError`` (``ConfigError`` included); any other exception keeps its traceback.
"""

from __future__ import annotations

import contextlib
import errno
import signal
import sys
import time
import warnings
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.core import TyperCommand, TyperGroup

from attnflow.io.out_folder import check_out_folder

SEED_MAX = 2**63 - 1  # seeds are signed 64-bit integers
SET = "SECTION.KEY=VALUE"  # the metavar of every --set
EXIT_OK, EXIT_EXPECTATION_FAILED, EXIT_BAD_INPUT, EXIT_UNFINISHED = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT
EXIT_CODES = {
    EXIT_OK: "done as asked",
    EXIT_EXPECTATION_FAILED: "reproduce: the runs finished but an expectation failed (see the report)",
    EXIT_BAD_INPUT: "bad input: one line on stderr, nothing written",
    EXIT_UNFINISHED: "a run started but did not finish as asked: its folder records the status and why",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C): the folder keeps its snapshots; run --resume continues",
}

# click's usage error (typer vendors click in recent versions: found by name, not by module)
_UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


class _Readable:
    """Help that reads plainly: ``CONFIG`` in the usage line (not typer's ``{CONFIG}``), and no
    ``<bool>`` beside ``--help``. A usage error (an unknown option or command, a value out of range,
    a missing argument) is one line on stderr and exit code 2, like any other bad input."""

    def parse_args(self, ctx, args):
        with _one_line_usage_errors(ctx):
            return super().parse_args(ctx, args)

    def resolve_command(self, ctx, args):
        with _one_line_usage_errors(ctx):
            return super().resolve_command(ctx, args)

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option

    def collect_usage_pieces(self, ctx) -> list[str]:
        return [piece.removeprefix("{").removesuffix("}") for piece in super().collect_usage_pieces(ctx)]


@contextlib.contextmanager
def _one_line_usage_errors(ctx) -> Iterator[None]:
    try:
        yield
    except _UsageError as error:
        if type(error).__name__ == "NoArgsIsHelpError":  # `attnflow` alone: the help, as asked
            raise
        say(f"error: {ctx.command_path}: {error.format_message()}")
        raise typer.Exit(code=EXIT_BAD_INPUT) from None


class Group(_Readable, TyperGroup):
    pass


class Command(_Readable, TyperCommand):
    pass


class ConfigCommand(Command):
    """A command that takes a TOML config: its help ends with every section and key, read from the
    schema when the help is shown (so ``--help`` of the other commands does not import it)."""

    @property
    def epilog(self) -> str:
        from attnflow.io.config_schema import SECTIONS

        keys = "; ".join(f"{name}: {', '.join(model.model_fields)}" for name, model in SECTIONS.items())
        meaning = "Each key's default, range and meaning: the config reference page of the documentation."
        return f"Config sections and their keys — {keys}. {meaning}"

    @epilog.setter
    def epilog(self, value) -> None:  # click sets it; the schema's keys replace it
        pass


app = typer.Typer(
    cls=Group,
    name="attnflow",
    help="Mean-field self-attention dynamics with frozen auxiliary variables.\n\nExit codes: "
    + "; ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES.items())
    + ".",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
stderr = Console(stderr=True)
stdout = Console()


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn bad input into one line on stderr and exit code 2.

    The library reports bad input as ``ValueError`` (``ConfigError`` and the other input errors
    subclass it). A seed worker process that died (``BrokenProcessPool``) is one line and exit
    code 3; any other exception is a bug or a failure of the machine, and keeps its traceback.
    """
    try:
        yield
    except ValueError as error:
        say(f"error: {error}")
        raise typer.Exit(code=EXIT_BAD_INPUT) from None
    except BrokenProcessPool as error:  # a seed worker died (killed, out of memory): the run did not finish
        say(f"error: {error}")
        raise typer.Exit(code=EXIT_UNFINISHED) from None


def say(line: str) -> None:
    """One plain line on stderr (no markup, no wrapping)."""
    stderr.print(line, markup=False, highlight=False, soft_wrap=True)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        stdout.print(f"attnflow {version('attnflow')}")
        raise typer.Exit()


@app.callback()
def _options(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, metavar="", help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Mean-field self-attention dynamics with frozen auxiliary variables."""
    # Ctrl-C is the command's from here (the console entry guarded the start-up until now): `run`
    # notes it while it builds, `reproduce` raises it and notes it, the others receive KeyboardInterrupt.
    _INTERRUPTS.clear()
    handlers = {"run": _note_interrupt, "reproduce": _note_and_interrupt}
    signal.signal(signal.SIGINT, handlers.get(ctx.invoked_subcommand, signal.default_int_handler))


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ARG001
    """A warning at the command line: ``warning: <message>``, one line on stderr (no source line)."""
    say(f"warning: {message}")


def _positive(value: float) -> float:
    if not value > 0:
        raise typer.BadParameter(f"must be > 0; got {value!r}.")
    return value


def _refuse_an_earlier_run_of_this_config(out: Path, *, resume: bool, overwrite: bool) -> None:
    """The default folder ``runs/<config hash>`` already holds a run: the same config ran before."""
    from attnflow.workflows.run import MARKER

    if (out / MARKER).exists() and not (resume or overwrite):
        raise ValueError(
            f"run: the default `--out` {str(out)!r} (named after the config's hash) must be new; got the "
            "folder of an earlier run of this same config. Pass --resume to continue it, --overwrite "
            "to run it again, or --out DIR for another folder."
        )


def _at_least_one(value: int | None) -> int | None:
    if value is not None and value < 1:
        raise typer.BadParameter(f"must be >= 1; got {value!r}.")
    return value


def exit_unless_ok(status: str, folder: Path) -> None:
    """Exit with ``EXIT_UNFINISHED`` and one line when a run ended with a status other than "ok"."""
    status = getattr(status, "value", status)  # a numerics Status or its name
    if status != "ok":
        say(f"error: the run did not finish as asked: status {status!r}; the folder {str(folder)!r} keeps "
            "every completed snapshot and records the status in metrics.json.")  # fmt: skip
        raise typer.Exit(code=EXIT_UNFINISHED)


class ProgressReport:
    """A command's progress: a stage label and ``done/total``, with the time since it started.

    On a terminal, a rich bar on stderr (its count blank until the total is known). Off a terminal
    (CI, a SLURM log), plain lines on stdout from the library's first call on (bad input found
    before it stays the command's only line): one when the stage changes and one each tenth of the
    total. ``report(done, total, stage=...)`` is called with the library's progress (``stage`` the label
    from then on).
    """

    def __init__(self, command: str, stage: str, bar: Progress | None) -> None:
        self.command, self.bar, self.start = command, bar, time.perf_counter()
        self.label, self.done, self.total, self.tenths = stage, 0, None, 0
        self.task = None if bar is None else bar.add_task(f"{command}: {stage}", total=None, count="")

    def __call__(self, done: int, total: int, *, stage: str | None = None) -> None:
        first, self.done, self.total = self.total is None, done, total
        tenths = 10 * done // total if total else 0
        changed = stage is not None and stage != self.label
        self.label = stage or self.label
        self._show(line=first or changed or tenths > self.tenths)
        self.tenths = max(tenths, self.tenths)

    def _count(self) -> str:
        return "" if not self.total else f"{self.done}/{self.total} ({100 * self.done // self.total}%)"

    def _show(self, *, line: bool) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=f"{self.command}: {self.label}", count=self._count(),
                            completed=self.done, total=self.total or None)  # fmt: skip
        elif line:
            count = f" {self._count()}" if self.total else ""
            text = f"{self.command}: {self.label}{count} [{time.perf_counter() - self.start:.1f} s]"
            stdout.print(text, markup=False, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def progress_report(command: str, stage: str) -> Iterator[ProgressReport]:
    """The progress of ``command``, from ``stage`` on: a bar on a terminal, plain lines otherwise."""
    if not stderr.is_terminal:
        yield ProgressReport(command, stage, None)
        return
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[count]}"))
    with Progress(*columns, TimeElapsedColumn(), console=stderr, transient=True) as bar:
        yield ProgressReport(command, stage, bar)


def snapshot_stages(report: ProgressReport):
    """The progress callback of a run (``attnflow.workflows.run``): its first call comes before the
    solve compiles, the next ones as snapshots are stored, the last before the figures are drawn."""

    def call(done: int, total: int) -> None:
        stage = "compiling" if report.label == "building" else "drawing" if done == total else "simulating"
        report(done, total, stage=stage)

    return call


def job_stages(report: ProgressReport):
    """The progress callback of ``reproduce``: called as snapshots (jobs in this process) or whole
    tasks (in worker processes) finish, each job compiling, simulating and measuring; a call with
    nothing done yet means the jobs are compiling; the last comes before the report is drawn."""

    def call(done: int, total: int) -> None:
        report(done, total, stage="compiling" if done == 0 else "drawing" if done == total else "simulating")

    return call


def print_summary(title: str, rows: dict) -> None:
    table = Table(title=title, show_header=False)
    for key, value in rows.items():
        table.add_row(key, f"{value:.6g}" if isinstance(value, float) else str(value))
    stdout.print(table)


SUMMARY_KEYS = (
    "energy", "energy_gap", "mean_cosine", "gauge_mean_cosine", "shape", "gauge_shape", "n_clusters", "n_eff",
    "orbit_residual", "planarity", "collapse_time", "gauge_collapse_time", "energy_monotone",
)  # fmt: skip


_INTERRUPTS: list[int] = []  # SIGINTs received by `run` (process state, like the signal handler)


def _note_interrupt(signum: int, frame) -> None:  # noqa: ARG001
    """Ctrl-C while `run` imports and builds: noted, raised at the next safe point (raised here, it
    could land in a garbage-collector callback, which only prints it)."""
    _INTERRUPTS.append(signum)


def _note_and_interrupt(signum: int, frame) -> None:
    """Ctrl-C during `reproduce`: noted, and raised at once unless it arrived in a finaliser or a
    garbage-collector callback (JAX's), where Python would only print it: the next progress call
    raises it then."""
    _INTERRUPTS.append(signum)
    name = frame.f_code.co_name if frame is not None else ""
    if name != "__del__" and "gc_callback" not in name:
        raise KeyboardInterrupt


def _raising_noted_interrupts(progress):
    """``progress`` that raises KeyboardInterrupt at the first snapshot after a SIGINT noted while
    the run was being built (from the folder's claim on, the run handles SIGINT itself)."""

    def call(done: int, total: int) -> None:
        if _INTERRUPTS:
            raise KeyboardInterrupt
        progress(done, total)

    return call


DISK_FAILURES = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)  # a full, read-only or failing disk


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
    signal.signal(signal.SIGINT, _note_interrupt)  # Ctrl-C while importing and building: noted
    try:
        from attnflow.io.config import config_hash, load_config
        from attnflow.numerics.lanes import use_cpu_cores
        from attnflow.numerics.program_cache import enable_persistent_cache
        from attnflow.workflows.run import run as run_simulation

        enable_persistent_cache()
        use_cpu_cores()  # large n: the tile lanes run on every core (results do not depend on it)
        if _INTERRUPTS:
            raise KeyboardInterrupt
        with user_errors():
            cfg = load_config(config, set_)
            if _INTERRUPTS:
                raise KeyboardInterrupt
            if out is None:
                out = Path("runs") / config_hash(cfg)
                _refuse_an_earlier_run_of_this_config(out, resume=resume, overwrite=overwrite)
            out = check_out_folder(out)
            with progress_report("run", "building") as report:
                progress = _raising_noted_interrupts(snapshot_stages(report))
                result = run_simulation(cfg, out, progress=progress, resume=resume, overwrite=overwrite)
    except KeyboardInterrupt as stop:
        if getattr(stop, "out_dir", None) is None:  # not a RunInterrupted: before the run claimed its folder
            say("interrupted before the run started: nothing was written.")
        else:
            say(f"{stop}; metrics.json records status 'interrupted'. Continue with: attnflow run "
                f"{config} --out {out} --resume")  # fmt: skip
        raise typer.Exit(code=EXIT_INTERRUPTED) from None
    except OSError as error:  # the disk failed the run once started; any other OSError is a bug
        if error.errno not in DISK_FAILURES:
            raise
        say(f"error: {error.strerror} ({error.filename or out}); the run folder keeps every completed "
            "snapshot and records the status where the disk allowed.")  # fmt: skip
        raise typer.Exit(code=EXIT_UNFINISHED) from None
    info = result.metrics["run"]
    rows = {k: result.metrics.get(k) for k in SUMMARY_KEYS}
    rows.update(status=info["status"], steps=info["steps"], wall_time_s=info["wall_time_s"], folder=str(out))
    rows.update(interaction=info.get("interaction"), rank=info.get("rank"))  # the path that ran
    print_summary(f"attnflow run {config.name}", rows)
    exit_unless_ok(info["status"], out)


@app.command(cls=Command)
def plot(run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A run folder.")]) -> None:
    """Redraw the figures of a run folder from its stored trajectory."""
    from attnflow.workflows.run import replot

    with user_errors():
        paths = replot(run_dir)
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
    fps: Annotated[int, typer.Option(metavar="N", help="Frames per second of the animation.")] = 12,
    max_tokens: Annotated[int, typer.Option(metavar="N", help="Tokens shown (an even subsample).")] = 1000,
    max_frames: Annotated[
        int, typer.Option(metavar="N", help="Snapshots shown (an even subsample, ends included).")
    ] = 100,
) -> None:
    """Animate a run: viewer.html (rotatable 3-D view with a time slider, offline) and a GIF/MP4 of
    the tokens moving, the content beside the gauge frame, coloured by the label."""
    from attnflow.workflows.animate import animate as write_motion

    with user_errors():
        paths = write_motion(
            run_dir, out=out, viewer_only=viewer_only, fps=fps, max_tokens=max_tokens, max_frames=max_frames
        )
    for path in paths:
        stdout.print(str(path))


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
            callback=_at_least_one, metavar="K", help="Seeds 0..K-1 instead of each experiment's own."
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            callback=_at_least_one,
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
    """Run the paper's experiments E0-E9, check every expectation, write the report."""
    try:
        from attnflow.io.config import apply_overrides
        from attnflow.io.reproduce_folder import make_settings
        from attnflow.numerics.program_cache import enable_persistent_cache
        from attnflow.viz.report import failure_lines, summary_table
        from attnflow.workflows.reproduce import reproduce as run_reproduce
        from attnflow.workflows.reproduce import resume_command
        from attnflow.workflows.reproduce_plan import parse_only, parse_sizes

        enable_persistent_cache()
        with user_errors():
            ids, token_counts = parse_only(only), parse_sizes(sizes)
            apply_overrides({}, set_)  # malformed --set values, before any experiment is read
            check_out_folder(out)
            with progress_report("reproduce", "compiling") as report:
                options = dict(quick=quick, only=ids, sizes=token_counts, n_seeds=seeds, workers=workers)
                options.update(overrides=tuple(set_), resume=resume, overwrite=overwrite)
                progress = _raising_noted_interrupts(job_stages(report))
                outcome = run_reproduce(out, **options, progress=progress)
    except KeyboardInterrupt as stop:
        if getattr(stop, "kept", None) is None:  # not a ReproduceInterrupted: before the folder was touched
            say("interrupted before reproduce started: nothing was written.")
        else:
            settings = make_settings(quick=quick, sizes=token_counts, n_seeds=seeds, overrides=set_)
            say(f"{stop}; `{resume_command(out, settings, ids)}` continues")
        raise typer.Exit(code=EXIT_INTERRUPTED) from None
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
        int | None, typer.Option(metavar="N", help="Tokens (orbit: default the sample count).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(metavar="DIR", help="Run folder (default runs/realize-<kind>-<name>).")
    ] = None,
    seed: Annotated[
        int, typer.Option(min=0, max=SEED_MAX, metavar="SEED", help="Seed of the initial data.")
    ] = 0,
    t_end: Annotated[
        float, typer.Option(callback=_positive, metavar="TAU", help="Final time τ (> 0).")
    ] = 40.0,
    mode: Annotated[
        str,
        typer.Option(
            metavar="a-priori|exact",
            help="'a-priori' (gauges fixed before the run) or 'exact' (the gauge frame simulated "
            "first, the gauges chosen from the consensus it reaches: realised to round-off).",
        ),
    ] = "a-priori",
) -> None:
    """Realise a target law: build the gauge, run the dynamics, write the run folder."""
    from attnflow.numerics.program_cache import enable_persistent_cache
    from attnflow.workflows.realize import SUMMARY_KEYS as REALIZE_KEYS
    from attnflow.workflows.realize import run_realisation

    enable_persistent_cache()
    with user_errors():
        out = check_out_folder(out if out is not None else Path("runs") / f"realize-{kind}-{target.stem}")
        with progress_report("realize", "simulating") as bar:
            result = run_realisation(
                target, kind=kind, n=n, out=out, seed=seed, t_end=t_end, mode=mode, progress=bar
            )
    rows = {k: result.get(k) for k in REALIZE_KEYS}
    rows.update(status=result["run"]["status"], wall_time_s=result["run"]["wall_time_s"], folder=str(out))
    print_summary(f"attnflow realize --kind {kind} {target.name}", rows)
    exit_unless_ok(result["run"]["status"], out)


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
        int | None, typer.Option(metavar="N", help="Local worker processes (default: 1 per core).")
    ] = None,
    yes: Annotated[
        bool, typer.Option("--yes", metavar="", help="Run a grid of more than 1000 points.")
    ] = False,
) -> None:
    """Run a resumable Cartesian sweep on Dask distributed (finished points are skipped)."""
    from attnflow.io.config import load_config
    from attnflow.workflows.sweep import TlsFiles, check_scheduler, parse_grid, plan_sweep, run_sweep
    from attnflow.workflows.sweep_plan import MAX_POINTS

    with user_errors():
        check_out_folder(out)
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
        axes = [parse_grid(spec) for spec in grid]
        plan = plan_sweep(load_config(config, set_), axes, max_points=None if yes else MAX_POINTS)
        with progress_report("sweep", "simulating") as progress:
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
            help="Column (mean per cell; text: most frequent) or NAME OP VALUE: n_clusters>=2.",
        ),
    ],
    out: Annotated[
        Path | None, typer.Option(metavar="FILE", help="PNG (default DIR/figures/phase_<metric>.png).")
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
        int, typer.Option(min=0, metavar="N", help="Random starts besides the closed-form candidates.")
    ] = 8,
    continue_: Annotated[
        str | None,
        typer.Option(
            "--continue",
            metavar="KEY=START:STOP:STEP",
            help="Follow every state in a parameter: beta=0.5:5:0.1.",
        ),
    ] = None,
) -> None:
    """Find the stationary states of the energy (Newton), their Morse index (Lanczos), branches."""
    from attnflow.io.config import load_config
    from attnflow.workflows.landscape import parse_continuation, run_landscape

    with user_errors():
        cfg = load_config(config, set_)
        continuation = None if continue_ is None else parse_continuation(continue_)
        check_out_folder(out)
        result = run_landscape(cfg, out, starts=starts, continuation=continuation)
    best = result.states[0] if result.states else None
    rows = {"states": len(result.states), "starts": len(result.starts)}
    if best is not None:
        rows.update(best_energy=best.energy, best_index=best.morse_index, best_shape=best.shape)
    rows.update(
        {f"transition {t['branch']}": t[continuation.key] for t in result.transitions} if continue_ else {}
    )
    rows.update(folder=str(out))
    print_summary(f"attnflow landscape {config.name}", rows)


def main() -> None:
    """The program ``attnflow``: warnings are one line each (``warning: ...``) on stderr."""
    warnings.showwarning = _one_line_warning
    app()


if __name__ == "__main__":
    sys.exit(main())
