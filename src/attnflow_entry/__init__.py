"""The ``attnflow`` command's entry point: Ctrl-C while the command starts ends it with one line
and exit code 130, never a traceback.

It lives outside the ``attnflow`` package on purpose: importing any module of the package first
runs ``attnflow/__init__.py``, and a handler installed after that would leave the interpreter's
imports unguarded. Here the handler is in place before the first ``attnflow`` import (the command
line itself imports no JAX: each command imports what it needs when it runs), and it stays in
place while the command's arguments are parsed; the command then installs the one Ctrl-C policy
of every command (:mod:`attnflow.cli.interrupts`: one
line saying what was kept and how to continue, exit code 130). Once the command is done, SIGINT
is ignored: the exit code is the command's, not a death by signal during the teardown.
"""

import os
import signal
import sys

EXIT_INTERRUPTED = 130  # as a shell reports SIGINT; the same as attnflow.cli.EXIT_INTERRUPTED
MESSAGE = b"interrupted while starting: nothing was done.\n"


def _interrupted_while_starting(signum, frame) -> None:  # noqa: ARG001
    os.write(2, MESSAGE)  # nothing else was written yet: no buffer to flush
    os._exit(EXIT_INTERRUPTED)


def main() -> None:
    """The console script ``attnflow`` (and ``python -m attnflow``)."""
    signal.signal(signal.SIGINT, _interrupted_while_starting)
    from attnflow.cli import main as cli_main  # after the handler: the point of this module

    try:
        sys.exit(cli_main())  # the command line's callback hands Ctrl-C to the command
    finally:
        # The command is done and its exit code decided. A Ctrl-C during the interpreter's (and
        # JAX's) teardown would turn that code into a death by SIGINT (Python restores the
        # default action of a signal it handled before it finalises): it is ignored instead.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
