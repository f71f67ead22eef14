"""Where a command may write: checked before anything is built, started or written.

``check_out_folder(path)`` raises ``OutFolderError`` (a ``ValueError``: bad input, exit code 2 at
the command line) with one line ``--out: <reason> (<path>)`` when ``path`` cannot become a run
folder: it is a file or a device, a path component is a file, a name is longer than the
filesystem allows, or the nearest existing folder is not writable (a read-only filesystem
included). It creates nothing.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


class OutFolderError(ValueError):
    """The output folder cannot be created or written."""


def _fail(option: str, code: int, path: Path) -> OutFolderError:
    return OutFolderError(f"{option}: {os.strerror(code)} ({path})")


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):  # not reported by this filesystem
        return 255


def check_out_folder(path: str | os.PathLike, *, option: str = "--out") -> Path:
    """``path`` as a ``Path`` if a run folder can be made there (see the module docstring)."""
    path = Path(path)
    absolute = Path(os.path.abspath(path))
    existing = absolute
    while not os.path.exists(existing) and existing != existing.parent:  # False for impossible names
        existing = existing.parent
    if not existing.is_dir():  # the path, or a component of it, is a file or a device
        raise _fail(option, errno.ENOTDIR, path)
    longest = _name_max(existing)
    if any(len(os.fsencode(part)) > longest for part in absolute.relative_to(existing).parts):
        raise _fail(option, errno.ENAMETOOLONG, path)
    if not os.access(existing, os.W_OK | os.X_OK):
        code = errno.EROFS if _read_only(existing) else errno.EACCES
        raise _fail(option, code, path)
    return path


def _read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False
