"""A folder no other user can write or swap, for files this process later runs as code (compiled
programs): :func:`check_private_folder`. Imports nothing heavy (the command line checks its cache
folder before JAX starts).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["CACHE_ENV", "CacheFolderError", "cache_folder", "cache_turned_off", "check_private_folder"]

CACHE_ENV = "ATTNFLOW_CACHE_DIR"
HINT = "Set ATTNFLOW_CACHE_DIR to a folder under your home (it is created with mode 0o700)."


def cache_turned_off() -> bool:
    """``ATTNFLOW_CACHE_DIR=off``: no compiled program is written to or read from disk (every
    process compiles its own; the test suite runs this way)."""
    return os.environ.get(CACHE_ENV, "").strip().lower() == "off"


def cache_folder() -> Path:
    """Where compiled programs persist between processes: ``$ATTNFLOW_CACHE_DIR`` if set, else
    ``$XDG_CACHE_HOME/attnflow/jax`` (``~/.cache/attnflow/jax`` without it)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "attnflow" / "jax"


class CacheFolderError(ValueError):
    """A compilation cache folder that another user could write or replace."""


def check_private_folder(folder: Path, *, create: bool = True) -> Path:
    """``folder``, created if missing with mode 0o700, after checking that no other user can write
    it or swap it or anything in it: it is a real folder (not a link) owned by this user with no
    group or other permission bits; every entry in it (JAX's cache files) is owned by this user and
    writable by no one else; and every folder above it is owned by this user or root and is not
    writable by group or others unless it has the sticky bit (``/tmp``: others cannot rename what is
    ours). A folder that exists is never changed (a folder attnflow makes is 0o700 whatever the
    umask, so an open one is somebody else's choice: refused, with the fix). Raises
    :class:`CacheFolderError` naming the folder and what is wrong. ``create`` False: nothing is made
    (a missing folder is left for the full check; the folders above it are checked all the same)."""
    folder = Path(folder).expanduser().absolute()
    uid = os.getuid()
    real = Path(os.path.realpath(folder))
    for parent in (*reversed(folder.parents), *reversed(real.parents)):  # the path as named, and as it is
        _check_above(parent, uid)
    if not create and not os.path.lexists(folder):
        return folder
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as error:
        raise CacheFolderError(
            f"cache: `{folder}` must be a folder this user can create; got {error.strerror}."
        ) from None
    info = os.lstat(folder)
    kind = "link" if stat.S_ISLNK(info.st_mode) else "file"
    if not stat.S_ISDIR(info.st_mode):
        raise CacheFolderError(f"cache: `{folder}` must be a real folder (no link or file); got a {kind}.")
    if info.st_uid != uid:
        raise CacheFolderError(
            f"cache: `{folder}` must be owned by this user (uid {uid}); got uid {info.st_uid}. " + HINT
        )
    if info.st_mode & 0o077:
        raise CacheFolderError(
            f"cache: `{folder}` must be private (mode 700); got mode {stat.S_IMODE(info.st_mode):o}: "
            f"`chmod 700 {folder}`, or " + HINT[0].lower() + HINT[1:]
        )
    _check_entries(folder, uid)
    return folder


ENTRIES_CHECKED_MAX = 100_000  # a cache folder holds a few thousand files; past this, refuse


def _check_entries(folder: Path, uid: int) -> None:
    """Every entry under ``folder`` is this user's and writable by no one else (a file planted by
    another user, e.g. root's tools or a folder that was shared once, would be loaded as code)."""
    checked = 0
    for root, dirs, files in os.walk(folder):
        for name in (*dirs, *files):
            checked += 1
            path = Path(root) / name
            try:
                info = os.lstat(path)
            except FileNotFoundError:  # removed meanwhile (JAX's cache evicts entries)
                continue
            if info.st_uid != uid or info.st_mode & 0o022 or stat.S_ISLNK(info.st_mode):
                raise CacheFolderError(
                    f"cache: every entry of `{folder}` must be this user's (uid {uid}), not a link and "
                    f"writable by no one else; got `{path}` (uid {info.st_uid}, mode "
                    f"{stat.S_IMODE(info.st_mode):o}). Delete it, or " + HINT[0].lower() + HINT[1:]
                )
        if checked > ENTRIES_CHECKED_MAX:
            raise CacheFolderError(
                f"cache: `{folder}` must hold at most {ENTRIES_CHECKED_MAX} entries to be checked; got more. "
                "Empty it (it is safe to delete), or " + HINT[0].lower() + HINT[1:]
            )


def _check_above(parent: Path, uid: int) -> None:
    try:
        info = os.stat(parent)
    except FileNotFoundError:
        return  # made below by mkdir, with our own mode
    shared_write = info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX
    if info.st_uid not in (uid, 0) or shared_write:
        raise CacheFolderError(
            f"cache: `{parent}` (above the cache folder) must be owned by this user or root and writable by "
            f"no one else unless sticky; got uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}. " + HINT
        )
