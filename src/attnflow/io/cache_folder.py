"""The folder where compiled programs persist between processes: checked before it is used.

``$ATTNFLOW_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/attnflow/jax`` (``~/.cache/attnflow/jax``).
Compiled programs are code this process later runs, so the folder must be the user's own and
private: :func:`check_cache_folder` raises :class:`CacheFolderError` (a ``ValueError``: one line
and exit code 2 at the command line) when it is not a folder, is owned by another user, is
readable or writable by others (group or world), or, not existing yet, cannot be created (its
nearest existing folder is not a writable folder). It creates and changes nothing.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["CACHE_ENV", "CacheFolderError", "cache_folder", "check_cache_folder"]

CACHE_ENV = "ATTNFLOW_CACHE_DIR"


class CacheFolderError(ValueError):
    """The compiled-program cache folder is not the user's own private folder."""


def cache_folder() -> Path:
    """``$ATTNFLOW_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/attnflow/jax`` (``~/.cache/...``)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "attnflow" / "jax"


def _fail(folder: Path, constraint: str, got: str) -> CacheFolderError:
    named = f"`{CACHE_ENV}`" if os.environ.get(CACHE_ENV) else f"the cache folder (`{CACHE_ENV}` unset)"
    hint = f"Set {CACHE_ENV} to a folder of your own (it is created with mode 0o700)."
    return CacheFolderError(f"cache: {named} must be {constraint}; got {str(folder)!r} ({got}). {hint}")


def check_cache_folder(folder: Path | None = None, *, uid: int | None = None) -> Path:
    """``folder`` (default :func:`cache_folder`) if it is, or can become, a private folder of the
    user ``uid`` (default: this process's effective user); else :class:`CacheFolderError`."""
    folder = cache_folder() if folder is None else Path(folder)
    uid = os.geteuid() if uid is None else uid
    try:
        info = os.stat(folder)  # follows a link: the folder that would be used
    except FileNotFoundError:
        return _check_creatable(folder)
    except OSError as error:
        raise _fail(folder, "a readable folder", error.strerror or str(error)) from None
    if not stat.S_ISDIR(info.st_mode):
        raise _fail(folder, "a folder", "not a folder")
    if info.st_uid != uid:
        raise _fail(folder, f"a folder you own (uid {uid})", f"owned by uid {info.st_uid}")
    if info.st_mode & 0o077:
        mode = f"mode {stat.S_IMODE(info.st_mode):#o}"
        raise _fail(folder, "private (mode 0o700: not readable or writable by others)", mode)
    return folder


def _check_creatable(folder: Path) -> Path:
    existing = Path(os.path.abspath(folder))
    while not os.path.exists(existing) and existing != existing.parent:
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):  # (a file on the way fails os.stat: not a folder)
        raise _fail(folder, "creatable", f"{str(existing)!r} is not writable")
    return folder
