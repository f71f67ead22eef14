"""Atomic file writes: a reader (or a killed writer) never sees half a file.

Every file is written under a temporary name in the same folder, flushed to disk (``fsync``) and
renamed over the destination (``os.replace``, atomic on POSIX and Windows); the folder entry is
then flushed too where the platform allows. A failure leaves the old file (or none) and no
temporary file behind.

- :func:`replacing`: the context manager the writers share (yields the temporary path).
- :func:`write_text`: a text file.
- :func:`write_json`: JSON with ``indent`` 2 (or ``indent``), one trailing newline. Non-finite
  floats (NaN, ±inf) are written as ``null``, so the file is valid JSON; NumPy scalars and arrays
  are written as the Python numbers and lists they hold, paths as strings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePath
from typing import Any

import numpy as np

__all__ = ["json_ready", "read_record", "replacing", "write_json", "write_record", "write_text"]


def _sync_folder(folder: Path) -> None:
    """Flush the folder entry of a rename (POSIX); a platform without it is skipped."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on a normal exit, flush it and rename it to ``path``.

    The body writes the whole file to the yielded path (by name: any library's writer works). On an
    exception the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _sync_folder(path.parent)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    path = Path(path)
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def json_ready(value: Any) -> Any:
    """``value`` with non-finite floats as ``None``, NumPy scalars and arrays as Python numbers and
    lists, tuples as lists and paths as strings; anything else JSON cannot hold raises TypeError."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | np.integer) and not isinstance(value, np.bool_):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(key): json_ready(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(item) for item in value]
    if isinstance(value, np.ndarray):
        return json_ready(value.tolist())
    if isinstance(value, PurePath):
        return str(value)
    raise TypeError(f"write_json: `data` must hold JSON values only; got {type(value).__name__}: {value!r}.")


def write_json(path: str | os.PathLike, data: Any, *, indent: int = 2) -> Path:
    """Write ``data`` as JSON to ``path`` atomically (non-finite floats as ``null``)."""
    text = json.dumps(json_ready(data), indent=indent, allow_nan=False)
    return write_text(path, text + "\n")


def write_record(path: str | os.PathLike, record: Any) -> Path:
    """Write a dataclass of arrays, numbers and strings as a ``.npz`` archive at ``path``,
    atomically (read back by :func:`read_record`)."""
    fields = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    path = Path(path)
    with replacing(path) as tmp, open(tmp, "wb") as file:
        np.savez(file, **fields)
    return path


def read_record(cls: type, path: str | os.PathLike) -> Any:
    """The dataclass ``cls`` from :func:`write_record`'s archive: 0-d entries as Python numbers and
    strings, the others as arrays (nothing unpickled)."""
    with np.load(path, allow_pickle=False) as data:
        return cls(**{key: data[key].item() if data[key].ndim == 0 else data[key] for key in data.files})
