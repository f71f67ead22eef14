"""The compilation cache folder, checked at the command line before JAX is imported.

The rule is :func:`attnflow.numerics.private_folder.check_private_folder` (a real folder owned by
this user, private, every folder above it safe), in a module that imports no JAX: the command line
runs it with ``create=False`` before the library starts (a refusal then costs about a second and
50 MB, not the seconds and 150 MB of importing JAX), and the cache runs it again, creating the
folder, when it is turned on.
"""

from __future__ import annotations

from pathlib import Path

from attnflow.numerics.private_folder import (
    CACHE_ENV,
    CacheFolderError,
    cache_folder,
    cache_turned_off,
    check_private_folder,
)

__all__ = ["CACHE_ENV", "CacheFolderError", "cache_folder", "check_cache_folder"]


def check_cache_folder(folder: Path | None = None) -> Path | None:
    """``folder`` (default :func:`cache_folder`) if it passes the rule of ``check_private_folder``
    without creating or changing anything; else :class:`CacheFolderError`. None where the default
    is asked for and the cache is turned off (``ATTNFLOW_CACHE_DIR=off``): nothing to check."""
    if folder is None and cache_turned_off():
        return None
    return check_private_folder(cache_folder() if folder is None else Path(folder), create=False)
