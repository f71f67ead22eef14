"""The typer app: exit codes, one-line errors and warnings, readable help, the checks of option values."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperCommand, TyperGroup

from attnflow.cli import interrupts
from attnflow.cli.console import say, stdout

SEED_MAX = 2**63 - 1  # seeds are signed 64-bit integers
SET = "SECTION.KEY=VALUE"  # the metavar of every --set
EXIT_OK, EXIT_EXPECTATION_FAILED, EXIT_BAD_INPUT, EXIT_UNFINISHED = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT
EXIT_TERMINATED = 143  # SIGTERM (a job's time limit, kill, timeout), as a shell reports it
EXIT_CODES = {
    EXIT_OK: "done as asked",
    EXIT_EXPECTATION_FAILED: "reproduce: the runs finished but an expectation failed (see the report)",
    EXIT_BAD_INPUT: "bad input: one line on stderr, nothing written",
    EXIT_UNFINISHED: "a run started but did not finish as asked: its folder records the status and why",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C): the folder keeps its snapshots; run --resume continues",
    EXIT_TERMINATED: "stopped by SIGTERM (a job's time limit, kill, timeout): as 130",
}
STOP_CODES = {signal.SIGINT: EXIT_INTERRUPTED, signal.SIGTERM: EXIT_TERMINATED}  # the exit code of each stop

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

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:  # typer's shell-completion flags: no <bool> beside them either
            if param.name in ("install_completion", "show_completion"):
                param.metavar = ""
        return params

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
    """A command: Ctrl-C while it runs is one line and exit code 130, SIGTERM the same with exit code
    143 (:mod:`attnflow.cli.interrupts`)."""

    def invoke(self, ctx):
        # Ctrl-C and SIGTERM from here: one policy for every command (cli.interrupts). Not earlier:
        # until the command's own arguments are parsed, the entry's policy holds (a KeyboardInterrupt
        # raised while click parses them would end the command line with no line at all)
        interrupts.install()
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as stop:
            say(interrupts.stop_line(stop, ctx.info_name))
            raise typer.Exit(code=STOP_CODES[interrupts.stopped_by()]) from None


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
    add_completion=True,  # --install-completion, --show-completion (bash, zsh, fish, PowerShell)
    pretty_exceptions_enable=False,
)


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


DISK_FAILURES = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)  # a full, read-only or failing disk
REFUSED_WRITES = (errno.EACCES, errno.EPERM)  # the folder made read-only (chmod) after the start


def disk_failure(error: OSError, folder: Path | None) -> bool:
    """Whether ``error`` is the disk failing a command that had started writing into ``folder``: a
    full, read-only or failing disk anywhere, or a write refused inside ``folder`` (its permissions
    changed after the start-up checks). Any other OSError is a bug and keeps its traceback."""
    if error.errno in DISK_FAILURES:
        return True
    if error.errno not in REFUSED_WRITES or folder is None or error.filename is None:
        return False
    inside = os.path.abspath(os.fsdecode(error.filename))
    return os.path.commonpath([inside, os.path.abspath(folder)]) == os.path.abspath(folder)


@contextlib.contextmanager
def disk_failures(folder: Path | None, *, kept: str = "what was complete before") -> Iterator[None]:
    """A :func:`disk_failure` while the block writes into ``folder``: one line on stderr and exit
    code 3 (the run started but did not finish as asked)."""
    try:
        yield
    except OSError as error:
        if not disk_failure(error, folder):
            raise
        say(f"error: {error.strerror} ({error.filename or folder}); the folder {str(folder)!r} keeps {kept}.")
        raise typer.Exit(code=EXIT_UNFINISHED) from None


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        stdout.print(f"attnflow {version('attnflow')}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, metavar="", help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Mean-field self-attention dynamics with frozen auxiliary variables."""


def one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ARG001
    """A warning at the command line: ``warning: <message>``, one line on stderr (no source line)."""
    say(f"warning: {message}")


STATUS_HINTS = {  # what a status other than "ok" asks of the user
    "max_steps": " (the adaptive solver reached its step bound, `solver.max_steps` or 10^6 trial steps "
    "per snapshot: raise solver.max_steps, loosen solver.rtol and solver.atol, or use a fixed-step "
    "method)",
    "nonfinite": " (the state left the finite numbers: lower solver.dt or model.beta)",
    "under_resolved": " (the density concentrated below what its grid resolves: raise density.grid or "
    "density.lmax, or stop earlier with solver.t_end; the store keeps the resolved snapshots)",
}


def exit_unless_ok(status: str, folder: Path) -> None:
    """Exit with ``EXIT_UNFINISHED`` and one line when a run ended with a status other than "ok"."""
    status = getattr(status, "value", status)  # a numerics Status or its name
    if status != "ok":
        why = STATUS_HINTS.get(status, "")
        say(f"error: the run did not finish as asked: status {status!r}{why}; the folder {str(folder)!r} "
            "keeps every completed snapshot and records the status in metrics.json.")  # fmt: skip
        raise typer.Exit(code=EXIT_UNFINISHED)
