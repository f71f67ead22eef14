"""How large a configuration may be: the file, its nesting, its integers, an adaptive run's snapshots.

Every limit is checked before anything is built or written, and reported as one
:class:`~attnflow.io.config_errors.ConfigError` line:

- the config file is a regular file (not a FIFO, a device such as ``/dev/zero``, a folder) of at
  most :data:`MAX_FILE_BYTES`, and holds at least one setting (an empty file is refused: it would
  run the defaults, which is rarely what was meant); :func:`read_config_bytes` opens it without
  blocking (a FIFO with no writer) and reads at most one byte past the cap;
- tables and arrays nest at most :data:`MAX_DEPTH` deep (the deepest valid value, a list of
  generator matrices, is 5 deep: the file, its section, the list, a matrix, a row);
- an integer key (``model.n``, ``solver.block_size``, ``storage.token_stride``, ...) holds a signed
  64-bit integer, what the arrays it sizes can index (:func:`check_integers`);
- an adaptive run of more than :data:`~attnflow.io.config_rules.MAX_STEPS` snapshots is refused
  naming ``solver.save_every`` (:func:`check_adaptive_snapshots`): every snapshot costs at least one
  step, so such a run has more steps than a fixed-step run may have. The adaptive controller also
  stops after a bounded number of trial steps per snapshot (the run's status is then ``max_steps``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args

from attnflow.io.config_errors import ConfigError
from attnflow.io.config_rules import MAX_STEPS

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "check_adaptive_snapshots",
    "check_depth",
    "check_integers",
    "read_config_bytes",
]

MAX_FILE_BYTES = 16 * 2**20  # 16 MiB: a config with a few large generator matrices is well below
MAX_DEPTH = 16  # nested tables and arrays, the file itself counted as 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _file_kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_config_bytes(file: Path) -> bytes:
    """The bytes of the config file ``file``: a regular file of at most :data:`MAX_FILE_BYTES`.

    Opened with ``O_NONBLOCK`` (opening a FIFO does not wait for a writer) and checked with
    ``fstat`` on the open file (so a file swapped for a FIFO after a check is still refused).
    Raises ConfigError naming the file.
    """
    where = str(file)
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError.from_parts(
            None, "a readable TOML file", exc.strerror or str(exc), where=where
        ) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError.from_parts(None, "a regular TOML file", _file_kind(mode), where=where)
        chunks, size = [], 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, min(2**20, MAX_FILE_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigError.from_parts(
            None, "a readable TOML file", exc.strerror or str(exc), where=where
        ) from None
    finally:
        os.close(fd)
    if size > MAX_FILE_BYTES:
        raise ConfigError.from_parts(
            None,
            f"a file of at most {MAX_FILE_BYTES // 2**20} MiB",
            f"more than {MAX_FILE_BYTES} bytes",
            where=where,
        )
    return b"".join(chunks)


def check_depth(value: Any, *, where: str, key: str | None = None, start: int = 1) -> None:
    """Refuse tables and arrays nested deeper than :data:`MAX_DEPTH` (``start``: the depth of
    ``value`` itself). Iterative, so any depth Python can hold is checked without recursion."""
    stack = [(value, start)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping | list | tuple):
            if depth > MAX_DEPTH:
                raise depth_error(where=where, key=key)
            children = item.values() if isinstance(item, Mapping) else item
            stack.extend((child, depth + 1) for child in children)


def depth_error(*, where: str, key: str | None = None) -> ConfigError:
    """The error for a value nested too deep (also raised when the TOML parser runs out of stack)."""
    return ConfigError.from_parts(
        key,
        f"nested at most {MAX_DEPTH} tables or arrays deep",
        "a value nested deeper",
        hint="The deepest setting, a list of generator matrices, is 5 deep.",
        where=where,
    )


def _leaf_types(annotation: Any) -> set[Any]:
    """Every type named anywhere in a field's type (``int`` in ``Annotated[int, Ge(1)] | None``)."""
    args = get_args(annotation)
    if not args:
        return {annotation}
    return {leaf for arg in args for leaf in _leaf_types(arg)}


def _integer_field(annotation: Any) -> bool:
    """Whether a field takes integers as integers (a number field turns them into floats)."""
    leaves = _leaf_types(annotation)
    return int in leaves and float not in leaves


def check_integers(data: Mapping[str, Any], sections: Mapping[str, Any], *, where: str) -> None:
    """Refuse an integer key (``model.n``, ``solver.block_size``, ...) beyond a signed 64-bit integer.

    ``sections`` maps a section's name to its pydantic model; sections and keys it does not know
    are left to the schema (which names them as unknown).
    """
    for section, table in data.items():
        model = sections.get(section)
        if model is None or not isinstance(table, Mapping):
            continue
        for name, value in table.items():
            field = model.model_fields.get(name)
            if field is None or isinstance(value, bool) or not isinstance(value, int):
                continue
            if _integer_field(field.annotation) and not INT64_MIN <= value <= INT64_MAX:
                bound = "at most 2**63 - 1" if value > 0 else "at least -2**63"
                raise ConfigError.from_parts(
                    f"{section}.{name}",
                    f"an integer {bound} (a signed 64-bit integer, what the arrays hold)",
                    value,
                    where=where,
                )


def check_adaptive_snapshots(config: Any, *, where: str) -> None:
    """Refuse an adaptive run of more than ``MAX_STEPS`` snapshots (each costs at least one step)."""
    solver = config.solver
    if solver.method != "adaptive":
        return
    snapshots = solver.t_end / solver.save_every
    if snapshots > MAX_STEPS:
        raise ConfigError.from_parts(
            "solver.save_every",
            f"at least `solver.t_end` / {MAX_STEPS:.0e} = {solver.t_end / MAX_STEPS:.3g} for method "
            f"'adaptive' (at most {MAX_STEPS:.0e} snapshots, each at least one step)",
            solver.save_every,
            hint=f"That is {snapshots:.3g} snapshots (`solver.t_end` = {solver.t_end!r}); raise "
            "solver.save_every or lower solver.t_end.",
            where=where,
        )
