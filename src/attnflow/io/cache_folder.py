"""The compilation cache folder, checked at the command line before JAX is imported.

The rule is :func:`attnflow.numerics.program_cache.check_private_folder`, run when the cache is
turned on (a real folder owned by this user, private, every folder above it safe). That module
imports JAX, which costs seconds and about 150 MB before a refusal could be printed; so the command
line first runs :func:`check_cache_folder`, the cheap part of the same rule with the same messages:
the folder, if it exists, is a real folder (not a link or a file) owned by this user. It creates
and changes nothing; what it passes is checked in full afterwards.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["CACHE_ENV", "CacheFolderError", "cache_folder", "check_cache_folder"]

CACHE_ENV = "ATTNFLOW_CACHE_DIR"


class CacheFolderError(ValueError):
    """A compilation cache folder that another user could write or replace."""


def cache_folder() -> Path:
    """``$ATTNFLOW_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/attnflow/jax`` (``~/.cache/...``)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "attnflow" / "jax"


def check_cache_folder(folder: Path | None = None) -> Path:
    """``folder`` (default :func:`cache_folder`) unless it exists and is not a real folder owned by
    this user: then :class:`CacheFolderError`, worded as the full check words it."""
    folder = (cache_folder() if folder is None else Path(folder)).expanduser().absolute()
    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        return folder  # made private when the cache is turned on
    except OSError as error:
        raise CacheFolderError(
            f"cache: `{folder}` must be a readable folder; got {error.strerror}."
        ) from None
    if not stat.S_ISDIR(info.st_mode):
        kind = "link" if stat.S_ISLNK(info.st_mode) else "file"
        raise CacheFolderError(f"cache: `{folder}` must be a real folder (no link or file); got a {kind}.")
    uid = os.getuid()
    if info.st_uid != uid:
        raise CacheFolderError(
            f"cache: `{folder}` must be owned by this user (uid {uid}); got uid {info.st_uid}. "
            f"Set {CACHE_ENV} to a folder of your own."
        )
    return folder
