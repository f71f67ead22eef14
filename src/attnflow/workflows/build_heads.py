"""The heads of a config's ``[attention]`` section (:mod:`attnflow.core.heads`), built once.

``make_heads(config, xi, dtype)`` returns one :class:`~attnflow.core.heads.Head` per head: the maps
of ``attention.weights`` (a seeded generator, or a ``.npz`` file with ``query``, ``key``, ``value``
``(H, d_h, d)`` and ``output (H, d, d_h)``), the config's gauge built in the head dimension ``d_h``
(the same for every head, as in a RoPE layer) and the config's factor (with ``attention.alibi``,
head ``h`` gets the slope ``factor.slope · 2^{−8h/H}``). Every defect of a weights file is a
``ConfigError`` naming ``attention.weights``.
"""

from __future__ import annotations

import os
import stat
import zipfile

import numpy as np

from attnflow.core import heads as heads_maths
from attnflow.io.config import Config, ConfigError

MAX_WEIGHTS_BYTES = 2**31  # a weights file larger than 2 GiB is refused before it is read


def _fail(constraint: str, value) -> ConfigError:
    return ConfigError.from_parts("attention.weights", constraint, value)


def _load_weights(path: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The four arrays of a ``.npz`` file, each of its expected shape and finite (no pickles): a
    regular file of at most ``MAX_WEIGHTS_BYTES`` (a FIFO or a device is refused unread)."""
    try:
        info = os.stat(path)
    except OSError as error:
        raise _fail("a readable .npz file", f"{path} ({error.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise _fail("a regular .npz file", f"{path} (not a regular file)")
    if info.st_size > MAX_WEIGHTS_BYTES:
        raise _fail(f"a .npz file of at most {MAX_WEIGHTS_BYTES} bytes", f"{path} ({info.st_size} bytes)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = [name for name in shapes if name not in archive.files]
            if missing:
                raise _fail(f"a .npz file holding the arrays {list(shapes)}", f"{path} without {missing}")
            arrays = {}
            for name, shape in shapes.items():
                array = archive[name]
                if array.shape != shape:
                    raise _fail(f"a .npz file whose `{name}` has shape {shape}", f"{path}: {array.shape}")
                if not np.issubdtype(array.dtype, np.number) or not np.all(np.isfinite(array)):
                    raise _fail(f"a .npz file whose `{name}` is finite numbers", f"{path}: {name}")
                arrays[name] = np.asarray(array, dtype=np.float64)
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        if isinstance(error, ConfigError):
            raise
        raise _fail("a readable .npz file", f"{path} ({type(error).__name__}: {error})") from None
    return arrays


def head_maps(config: Config) -> dict[str, np.ndarray]:
    """``{"query", "key", "value", "output"}``, stacked over the heads."""
    attention, d = config.attention, config.model.d
    count = attention.heads
    head_dim = attention.head_dim or d
    if attention.weights == "identity":
        return heads_maths.identity_maps(count, head_dim, d)
    maker = heads_maths.MAKERS.get(attention.weights)
    if maker is not None:
        return maker(attention.seed, count, head_dim, d, scale=attention.scale)
    shapes = {"query": (count, head_dim, d), "key": (count, head_dim, d), "value": (count, head_dim, d)}
    shapes["output"] = (count, d, head_dim)
    return _load_weights(attention.weights, shapes)


def make_heads(config: Config, xi: np.ndarray, dtype, *, make_gauge, make_factor) -> tuple:
    """The heads of ``config`` (``make_gauge`` and ``make_factor``: the builders of the sections,
    :func:`attnflow.workflows.build.make_gauge` and ``make_factor``)."""
    attention = config.attention
    head_dim = attention.head_dim or config.model.d
    maps = head_maps(config)
    gauge = make_gauge(config, xi, dtype, d=head_dim)
    slopes = heads_maths.alibi_slopes(attention.heads) * config.factor.slope if attention.alibi else None
    shared_factor = None if attention.alibi else make_factor(config, xi, dtype)
    out = []
    for h in range(attention.heads):
        factor = shared_factor if slopes is None else make_factor(config, xi, dtype, slope=float(slopes[h]))
        arrays = [maps[name][h] for name in heads_maths.MAP_NAMES]
        out.append(
            heads_maths.make_head(*arrays, gauge=gauge, factor=factor, values=attention.values, dtype=dtype)
        )
    return tuple(out)
