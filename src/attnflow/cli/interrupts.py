"""Ctrl-C at the command line: noted where raising it would be lost (while importing and building,
in a garbage-collector callback) and raised at the next safe point, a progress call.

The handler of each command (set by the command line's callback): ``run`` notes it while it builds
(the run then handles SIGINT itself), ``reproduce`` raises it or notes it, ``sweep`` silences the
Dask cluster's loggers (its teardown logs every dropped task as an error) and raises it or notes
it; the others get Python's KeyboardInterrupt. Each command that writes turns it into one line
saying what was kept and exit code 130.
"""

from __future__ import annotations

import logging

NOTED: list[int] = []  # SIGINTs received by `run` (process state, like the signal handler)


def note(signum: int, frame) -> None:  # noqa: ARG001
    """Ctrl-C while `run` imports and builds: noted, raised at the next safe point (raised here, it
    could land in a garbage-collector callback, which only prints it)."""
    NOTED.append(signum)


def note_or_raise(signum: int, frame) -> None:
    """Ctrl-C during `reproduce`: noted, and raised at once unless it arrived in a finaliser or a
    garbage-collector callback (JAX's), where Python would only print it: the next progress call
    raises it then."""
    NOTED.append(signum)
    name = frame.f_code.co_name if frame is not None else ""
    if name != "__del__" and "gc_callback" not in name:
        raise KeyboardInterrupt


def quiet_and_raise(signum: int, frame) -> None:
    """Ctrl-C during `sweep`: the cluster's loggers silenced, then as :func:`note_or_raise`."""
    logging.getLogger("distributed").setLevel(logging.CRITICAL)
    note_or_raise(signum, frame)


def raising_noted(progress):
    """``progress`` that raises KeyboardInterrupt at the first snapshot after a SIGINT noted while
    the run was being built (from the folder's claim on, the run handles SIGINT itself)."""

    def call(done: int, total: int) -> None:
        if NOTED:
            raise KeyboardInterrupt
        progress(done, total)

    return call
