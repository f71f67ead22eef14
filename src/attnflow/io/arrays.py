"""The one loader of array files given by users (run's ``*.path`` keys, realize's ``--target``).

``load_array(path)`` returns the array of a ``.npy`` file as float64, or raises ``ArrayFileError``
(a ``ValueError``: bad input) carrying the ``constraint`` the file breaks and the ``value`` it has,
for the caller to phrase with the key or option that named the file. Each of these is one line,
never a hang or a traceback: a missing file, a symbolic-link loop, a folder, a FIFO or a device
(never opened: reading a FIFO would block), an empty file, a ``.npz`` archive, a file that is not
``.npy``, a malformed header, and a dtype that is not integer or float (complex, boolean, strings,
objects: ``dtype.kind`` must be one of ``"iuf"``). Nothing is unpickled.
"""

from __future__ import annotations

import os
import stat

import numpy as np

__all__ = ["ArrayFileError", "check_array_file", "load_array"]

_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"


class ArrayFileError(ValueError):
    """A file that does not hold one real array: ``constraint`` broken, ``value`` found."""

    def __init__(self, constraint: str, value: str) -> None:
        super().__init__(f"must be {constraint}; got {value}")
        self.constraint, self.value = constraint, value


def check_array_file(path: str | os.PathLike) -> None:
    """Raise ``ArrayFileError`` unless ``path`` names a non-empty regular file (nothing is opened:
    the command line checks ``--target`` this way before it imports the library)."""
    _check_kind(path, _stat(path))


def _stat(path: str | os.PathLike) -> os.stat_result:
    try:
        return os.stat(path)  # follows links: a loop is ELOOP here, before any open
    except OSError as error:
        reason = error.strerror if type(error) is OSError else type(error).__name__  # ELOOP: no subclass
        raise ArrayFileError("a readable .npy file", f"{str(path)!r} ({reason})") from None


def _check_kind(path: str | os.PathLike, info: os.stat_result) -> None:
    shown = str(path)
    if not stat.S_ISREG(info.st_mode):
        kind = (
            "a folder"
            if stat.S_ISDIR(info.st_mode)
            else "a FIFO"
            if stat.S_ISFIFO(info.st_mode)
            else "a device"
        )
        raise ArrayFileError("a regular .npy file", f"{shown!r} ({kind})")
    if info.st_size == 0:
        raise ArrayFileError("a .npy file holding one array", f"{shown!r} (an empty file)")


def load_array(path: str | os.PathLike) -> np.ndarray:
    """The float64 array saved by ``np.save`` in ``path`` (see the module docstring)."""
    shown = str(path)
    _check_kind(path, _stat(path))
    try:  # opened without blocking and checked again on the open file: a FIFO swapped in is refused
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise ArrayFileError("a readable .npy file", f"{shown!r} ({error.strerror})") from None
    try:
        _check_kind(path, os.fstat(fd))
    except ArrayFileError:
        os.close(fd)
        raise
    try:
        with os.fdopen(fd, "rb") as file:
            magic = file.read(len(_NPY_MAGIC))
            if magic.startswith(_ZIP_MAGIC):
                raise ArrayFileError(
                    "a .npy file holding one array",
                    f"{shown!r} (a .npz archive: save one array with np.save)",
                )
            if magic != _NPY_MAGIC:
                raise ArrayFileError("a readable .npy file", f"{shown!r} (no .npy header)")
            file.seek(0)
            array = np.load(file, allow_pickle=False)
    except ArrayFileError:
        raise
    except Exception as error:  # malformed header or data: ValueError, EOFError, SyntaxError, TokenError
        reason = " ".join(str(error).split()) or type(error).__name__
        raise ArrayFileError("a readable .npy file", f"{shown!r} ({reason[:120]})") from None
    if array.dtype.kind not in "iuf":
        raise ArrayFileError("an array of integers or floats", f"{shown!r} with dtype {array.dtype}")
    return array.astype(np.float64)
