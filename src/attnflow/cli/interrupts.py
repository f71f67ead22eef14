"""Ctrl-C and SIGTERM: one policy for every command, set at the command line's edge.

SIGTERM is what SLURM sends a job's processes at its time limit (SIGKILL follows), and what
``kill``, ``timeout`` and a container's stop send: a request to stop, as Ctrl-C (SIGINT) is, so it
takes the same path. Only the account differs: the line names it ("stopped by SIGTERM" where
Ctrl-C's says "interrupted") and the exit code is 143, as a shell reports SIGTERM (Ctrl-C: 130).
The folder records the same status, ``interrupted``, and ``--resume`` continues it alike.

1. While the command starts (importing the package, parsing the command's arguments), the console
   entry (``attnflow_entry``) ends the process with one line and exit code 130 (SIGTERM: 143).
2. Once the command's arguments are parsed (``attnflow.cli.app.Command.invoke``), :func:`handler`
   takes SIGINT and SIGTERM and raises KeyboardInterrupt where it lands (raised earlier, while
   click parses, click would end the process with exit code 130 and no line). The folders need
   nothing more: their writes are ordered so that a stop at any moment leaves a folder that
   ``--resume`` continues (:mod:`attnflow.io.run_folder` says how). What raising at once does not
   cover, and this policy does:

   - a signal that lands in a finaliser or a garbage-collector callback (JAX registers some),
     where Python would only print the exception: it is noted and raised at the next progress
     call (:func:`checked`);
   - a signal that lands inside an import (the commands import JAX when they run): raised there,
     it can leave a native module half initialised, and jaxlib's was seen to crash the process
     (SIGSEGV, no line); it is noted and raised at the next progress call, as above;
   - a second signal while the command stops (closing its store, writing its status, saying
     what it kept): noted, not raised, so that the record of the first one is complete;
   - Dask's teardown logs every task it drops as an error: the ``distributed`` loggers are
     silenced before the interrupt is raised.

   The worker processes a command starts (:mod:`attnflow.numerics.batch`) block both signals, so
   that a signal sent to every process (a terminal's Ctrl-C to its process group, ``timeout``'s
   SIGTERM, SLURM's, which may reach each process of a job in turn) stops the command, which ends
   its workers, and kills no worker first.
3. The command's KeyboardInterrupt becomes one line and exit code 130, or 143 when SIGTERM raised
   it (:func:`stop_line` and :func:`stopped_by`, called by every command,
   ``attnflow.cli.app.Command``): what was kept and the command that continues, as the command
   said with :func:`on_stop`, or that nothing was written.
4. Once the command is done, SIGINT and SIGTERM are ignored (``attnflow_entry``): the exit code is
   the command's, not a death by signal during the interpreter's teardown. A SIGTERM then asks
   a process whose work is done and recorded to stop tearing down: its exit code would say the
   work was cut short, and a supervisor that insists follows with SIGKILL anyway (SLURM after its
   ``KillWait``, 30 s by default).
"""

from __future__ import annotations

import logging
import signal
import sys

STOPS = (signal.SIGINT, signal.SIGTERM)  # the signals of this policy
CAUSES = {signal.SIGINT: "interrupted", signal.SIGTERM: "stopped by SIGTERM"}  # what a line says of each
NOTED: list[int] = []  # the signals received (process state, like the signal handler itself)
RAISED: list[int] = []  # of those, the one raised as KeyboardInterrupt
STOP: dict[str, str] = {}  # what a stopped command says (on_stop)


def install() -> None:
    """Make :func:`handler` the SIGINT and SIGTERM handler of the command about to run (a fresh
    state)."""
    NOTED.clear()
    RAISED.clear()
    STOP.clear()
    for signum in STOPS:
        signal.signal(signum, handler)


def _in_finaliser(frame) -> bool:
    name = frame.f_code.co_name if frame is not None else ""
    return name == "__del__" or "gc_callback" in name


def _in_import(frame) -> bool:
    while frame is not None:
        if getattr(frame.f_code, "co_filename", "").startswith("<frozen importlib"):
            return True
        frame = getattr(frame, "f_back", None)
    return False


def handler(signum: int, frame) -> None:
    """Raise KeyboardInterrupt, unless the command is already stopping or the signal landed where
    Python would only print it or inside an import (then the next progress call raises it)."""
    NOTED.append(signum)
    if "distributed" in sys.modules:  # a sweep's cluster: its teardown would log every dropped task
        logging.getLogger("distributed").setLevel(logging.CRITICAL)
    if RAISED or _in_finaliser(frame) or _in_import(frame):
        return
    RAISED.append(signum)
    raise KeyboardInterrupt


def checked(progress):
    """``progress`` that first raises a signal noted but not yet raised (see :func:`handler`)."""

    def call(*args, **kwargs) -> None:
        if NOTED and not RAISED:
            RAISED.append(NOTED[-1])
            raise KeyboardInterrupt
        progress(*args, **kwargs)

    return call


def on_stop(*, continues: str | None = None, kept: str | None = None) -> None:
    """What the command says if it is stopped from now on: ``continues``, how to continue after the
    workflow's own account of what it kept (``RunInterrupted``, ``ReproduceInterrupted``); ``kept``,
    what it keeps when the workflow gives no account (a sweep: its finished points)."""
    STOP.update({key: text for key, text in (("continues", continues), ("kept", kept)) if text})


def stopped_by() -> int:
    """The signal that stopped the command: the one raised (SIGINT for a KeyboardInterrupt that no
    signal raised, as Python's own Ctrl-C handler raises it)."""
    return RAISED[0] if RAISED else signal.SIGINT


def stop_line(stop: KeyboardInterrupt, command: str) -> str:
    """The one line of a stopped command: the workflow's account and the command's continuation,
    else what the command said it keeps, else that nothing was written. It begins with what
    stopped the command (:data:`CAUSES`): the workflows' accounts begin with "interrupted", the
    word of Ctrl-C, which a SIGTERM's line replaces."""
    cause = CAUSES[stopped_by()]
    told = str(stop)
    if told:
        told = cause + told.removeprefix("interrupted") if told.startswith("interrupted") else told
        return f"{told}; {STOP['continues']}" if "continues" in STOP else told
    if "kept" in STOP:
        return f"{cause}: {STOP['kept']}"
    return f"{cause} before {command} started: nothing was written."
