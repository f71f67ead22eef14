"""A command's output folder, start to end: where it may be, whose it is, who writes it now.

Every command that writes a folder goes through this module: ``run`` and ``realize`` (a run
folder), each point of a ``sweep`` (a run folder in a staging folder), ``landscape`` and
``reproduce``. Each declares its :class:`Layout` (its marker file and the entries it writes);
the rules are the same for all:

- :func:`check_out_folder`: ``--out`` can become a folder at all (not a file or a device, no
  name too long, a writable parent); checked before anything is built, creates nothing;
- :func:`claimed`: the folder made the command's for the body, in this order: created if new;
  locked (``flock`` on the folder, released by the kernel when the process dies, SIGKILL
  included: of two commands started into one folder exactly one writes, the other is refused
  in one line); checked: a new or empty folder, or with ``resume`` / ``overwrite`` a folder
  holding the command's marker (``--resume`` of a folder holding nothing to continue starts
  afresh); a folder holding anything else is refused whatever the options, but where the
  layout keeps a user's own files (``reproduce``: notes beside the report); then ``overwrite``
  removes the command's own entries (nothing else) and the marker is written. A refusal is an
  :class:`OutFolderError` (a ``ValueError``: exit code 2 at the command line) and changes
  nothing; a folder the claim created is removed again;
- :meth:`Claim.discard`: bad input found only after the claim (the store refusing an array)
  leaves nothing behind, not even the folder the claim made;
- :func:`in_use`: whether a live process holds a folder (a sweep removes only staging folders
  whose writer is gone).

Interrupts. The command line has one policy for Ctrl-C and SIGTERM
(:mod:`attnflow.cli.interrupts`): a KeyboardInterrupt raised where it lands. What a folder needs
is covered by the order of its writes, not by deferring the signal: every file is written whole
or not at all (:mod:`attnflow.io.atomic`), a store's snapshot counts once its time is written
after its state (:mod:`attnflow.io.store`), a reproduce record's JSON is written after its
arrays, a run's status last (after its figures: :func:`status_last`), and the lock dies with the
process. So an interrupt at any moment leaves a folder that :func:`claimed` with ``resume``
continues.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

__all__ = [
    "LANDSCAPE",
    "REALIZE",
    "RUN",
    "Claim",
    "Layout",
    "OutFolderError",
    "check_out_folder",
    "claimed",
    "in_use",
    "remove",
    "status_last",
]


class OutFolderError(ValueError):
    """The output folder cannot be created, written, or claimed by this command."""


# --------------------------------------------------------------------------- where a folder may be


def _fail(option: str, code: int, path: Path) -> OutFolderError:
    return OutFolderError(f"{option}: {os.strerror(code)} ({path})")


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):  # not reported by this filesystem
        return 255


def _read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_out_folder(path: str | os.PathLike, *, option: str = "--out") -> Path:
    """``path`` as a ``Path`` if a folder can be made there; else :class:`OutFolderError` with one
    line ``--out: <reason> (<path>)``: it is a file or a device, a path component is a file, a
    name is longer than the filesystem allows, a symbolic link points nowhere, or the nearest
    existing folder is not writable (a read-only filesystem included). Creates nothing."""
    path = Path(path)
    absolute = Path(os.path.abspath(path))
    existing = absolute
    while not os.path.lexists(existing) and existing != existing.parent:  # False for impossible names
        existing = existing.parent
    if existing.is_symlink() and not existing.exists():  # a link to nothing: no folder can be made
        raise OutFolderError(
            f"{option}: symbolic link to a missing target ({path} -> {os.readlink(existing)})"
        )
    if not existing.is_dir():  # the path, or a component of it, is a file or a device
        raise _fail(option, errno.ENOTDIR, path)
    longest = _name_max(existing)
    if any(len(os.fsencode(part)) > longest for part in absolute.relative_to(existing).parts):
        raise _fail(option, errno.ENAMETOOLONG, path)
    if not os.access(existing, os.W_OK | os.X_OK):
        code = errno.EROFS if _read_only(existing) else errno.EACCES
        raise _fail(option, code, path)
    return path


# --------------------------------------------------------------------------- whose a folder is


@dataclasses.dataclass(frozen=True)
class Layout:
    """What a command writes into its folder.

    ``command``: its name in messages. ``marker``: the file that makes a folder the command's.
    ``entries``: the top-level names it writes (a temporary ``.<name>.<...>`` a killed write left
    counts as its too). ``own``: instead of ``entries``, every path of its own in a folder (for
    a command that records what it wrote). ``keeps_foreign``: other files are left where they are
    (``overwrite`` removes only the command's own) instead of refused. ``resumable``: whether a
    folder holds something to continue (without it ``--resume`` starts afresh). ``options``: the
    options that continue or replace an earlier run, as the refusal suggests them."""

    command: str
    marker: str
    entries: tuple[str, ...] = ()
    own: Callable[[Path], list[Path]] | None = None
    keeps_foreign: bool = False
    resumable: Callable[[Path], bool] = lambda folder: True  # noqa: ARG005
    options: str = "Pass --resume to continue it or --overwrite to replace it"

    def is_own(self, name: str) -> bool:
        return name in self.entries or any(name.startswith(f".{entry}.") for entry in self.entries)

    def own_paths(self, folder: Path) -> list[Path]:
        """The command's own entries in ``folder`` (the marker not included)."""
        if self.own is not None:
            return [p for p in self.own(folder) if p.name != self.marker or p.parent != folder]
        return sorted(p for p in folder.iterdir() if self.is_own(p.name))


_RUN_ENTRIES = (
    "config.json",
    "metrics.json",
    "trajectory.zarr",
    "figures",
    "viewer.html",
    "movie.gif",
    "movie.mp4",
)

RUN = Layout(
    "run",
    ".attnflow-run",
    _RUN_ENTRIES,
    resumable=lambda folder: (folder / "trajectory.zarr").exists(),  # stopped before its store: starts again
)
REALIZE = dataclasses.replace(RUN, command="realize", options="Pass --overwrite to replace it")
LANDSCAPE = Layout(
    "landscape",
    ".attnflow-landscape",
    ("states.csv", "states.npz", "branches.csv", "transitions.csv", "branches.png", "landscape.json"),
    options="Pass --overwrite to replace it",
)


def remove(paths: Iterable[Path], folder: Path) -> None:
    """Remove ``paths`` (files and folders), then the subfolders of ``folder`` they leave empty."""
    parents = set()
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        parents.add(path.parent)
    for parent in sorted(parents, key=lambda p: -len(p.parts)):  # deepest first
        if parent != folder and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()


def _refusal(folder: Path, layout: Layout, *, resume: bool, overwrite: bool) -> str | None:
    """Why ``layout``'s command may not write into ``folder`` (None: it may). Reads only."""
    where = f"--out: {str(folder)!r}"
    entries = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    if not entries:
        return None
    if layout.marker not in entries:
        shown = ", ".join(repr(name) for name in entries[:3]) + (", ..." if len(entries) > 3 else "")
        return (f"{where} must be a new or empty folder or a {layout.command} folder; got other files "
                f"({shown}) and no {layout.marker}. Choose a new folder.")  # fmt: skip
    if not (resume or overwrite):
        return f"{where} must be a new or empty folder; got a {layout.command} folder. {layout.options}."
    if not layout.keeps_foreign:
        own = {p.name for p in layout.own_paths(folder)} | {layout.marker}
        foreign = [name for name in entries if name not in own]
        if foreign:
            return (f"{where} must hold only the {layout.command}'s files to be replaced or resumed; got "
                    f"{foreign[0]!r}.")  # fmt: skip
    return None


def _check_options(layout: Layout, *, resume: bool, overwrite: bool) -> None:
    if resume and overwrite:
        raise OutFolderError(
            f"{layout.command}: `--resume` and `--overwrite` must not be given together; got both."
        )


def check_claim(
    folder: str | os.PathLike, layout: Layout, *, resume: bool = False, overwrite: bool = False
) -> None:
    """Raise :class:`OutFolderError` unless ``layout``'s command may claim ``folder`` with these
    options (the rule of :func:`claimed`, without taking the folder). Writes nothing."""
    _check_options(layout, resume=resume, overwrite=overwrite)
    problem = _refusal(Path(folder), layout, resume=resume, overwrite=overwrite)
    if problem is not None:
        raise OutFolderError(problem)


# --------------------------------------------------------------------------- who writes a folder now


def _lock(folder: Path) -> int | None:
    """A descriptor of ``folder`` holding its exclusive lock, or None when another process holds it."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def in_use(folder: str | os.PathLike) -> bool:
    """Whether a live process holds ``folder`` (a command between its claim and its end)."""
    try:
        fd = _lock(Path(folder))
    except OSError:  # gone, or not a folder: nobody writes it
        return False
    if fd is None:
        return True
    os.close(fd)  # closing the descriptor releases the lock taken here
    return False


@dataclasses.dataclass(frozen=True)
class Claim:
    """A folder held by a command: ``resumed`` when it continues an earlier run there;
    ``created`` when the claim made the folder."""

    path: Path
    layout: Layout
    resumed: bool
    created: bool

    def discard(self) -> None:
        """Remove what the command wrote (its own entries and the marker), and the folder if the
        claim made it and nothing else is in it: bad input found after the claim leaves nothing."""
        remove([*self.layout.own_paths(self.path), self.path / self.layout.marker], self.path)
        if self.created and self.path.is_dir() and not any(self.path.iterdir()):
            self.path.rmdir()


@contextlib.contextmanager
def claimed(
    folder: str | os.PathLike,
    layout: Layout = RUN,
    *,
    resume: bool = False,
    overwrite: bool = False,
    check: Callable[[Path], None] | None = None,
) -> Iterator[Claim]:
    """Hold ``folder`` for ``layout``'s command during the body (see the module docstring).

    ``check(folder)``: the command's own rule on an earlier run it would continue (reproduce:
    the same settings), called once the folder is held, before anything changes. Yields a
    :class:`Claim`; the lock is released when the body ends, however it ends."""
    folder = check_out_folder(folder)
    _check_options(layout, resume=resume, overwrite=overwrite)  # the folder's rule once it is held
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # what no check foresees (a pseudo-filesystem such as /proc)
        raise _fail("--out", error.errno or errno.EIO, folder) from None
    fd = _lock(folder)
    if fd is None:
        raise OutFolderError(
            f"--out: {str(folder)!r} must not be in use; got a folder another {layout.command} is "
            "writing now."
        )
    try:
        earlier = (folder / layout.marker).exists()
        try:
            check_claim(folder, layout, resume=resume, overwrite=overwrite)  # as it is now, held
            if earlier and resume and check is not None:
                check(folder)
            resumed = earlier and resume and layout.resumable(folder)
            if earlier and not resumed and (overwrite or resume):  # replaced, or nothing to continue
                remove(layout.own_paths(folder), folder)
            (folder / layout.marker).touch()
        except BaseException:  # refused, or Ctrl-C: a new folder is left as it was found
            if not earlier:
                (folder / layout.marker).unlink(missing_ok=True)
            if created and not any(folder.iterdir()):
                folder.rmdir()
            raise
        yield Claim(path=folder, layout=layout, resumed=resumed, created=created)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- the status, last


@contextlib.contextmanager
def status_last(out_dir: Path, info: dict, close: Callable[[dict], None]) -> Iterator[dict]:
    """``with status_last(out_dir, info, close) as summary:`` the body fills ``summary`` (metrics,
    figures); then the status, last: ``close(metrics)`` closes the store (best effort: after a
    failure of the machine the store's own status is what a reader sees) and ``metrics.json``
    is written as ``{**summary, "run": info}``. Ctrl-C in the body records ``interrupted``, any
    other failure ``error`` (with ``info["error"]``), never the run's own status, and is raised
    again. Used by a particle run and a density run alike."""
    from attnflow.io.atomic import write_json

    summary: dict = {}

    def record() -> None:
        metrics = {**summary, "run": info}
        with contextlib.suppress(Exception):
            close(metrics)
        write_json(out_dir / "metrics.json", metrics)

    try:
        yield summary
    except BaseException as failure:
        stopped = isinstance(failure, KeyboardInterrupt)
        info["status"] = "interrupted" if stopped else "error"
        if not stopped:
            info["error"] = f"{type(failure).__name__}: {failure}"
        record()
        raise
    record()
