"""Compile once: what lets ``jax.jit`` keep one program per structure of a problem.

A run's program depends on the structure of the problem only: the shapes and dtypes of the state,
of the snapshot times and of the kernel's arrays, the kernel's kinds (gauge, factor, profile kind:
the pytree structure), the field's options (normalisation, causality, value, block size), the
method, the kind of step-size policy, the noise and whether the run is a batch. The numbers (beta,
the frequencies, the factor's values, ``dt``, ``save_every``, ``t_end``, the tolerances) are
arguments of the program, not constants baked into it: ``solve``'s problem is a pytree whose leaves
they are, and ``jax.jit``'s own cache does the rest. ``count_trace``/``info`` count the programs
traced (tests assert that a second run compiles nothing), ``compile_clock`` times them.

``split_field(field)`` separates a field into its structure (hashable) and its arrays, and
``join_field`` puts them back together; a plain function is its own structure (by identity).

``enable_persistent_cache()`` (the CLI commands call it) keeps compiled programs between processes
too: JAX's persistent cache, in a private user cache folder (``ATTNFLOW_CACHE_DIR`` overrides it;
``ATTNFLOW_CACHE_DIR=off`` turns it off).
A compiled program read from disk runs as code, so the folder must be one no other user can write
or swap (:func:`attnflow.numerics.private_folder.check_private_folder`), or the cache is refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax

from attnflow.core.pytree import ByIdentity
from attnflow.numerics.private_folder import cache_folder, cache_turned_off, check_private_folder

_COUNTS = {"misses": 0}


def split_field(field) -> tuple[Any, tuple]:
    """``(structure, leaves)``: how ``jax.jit`` sees a field. A field registered as a pytree (the
    fields of :mod:`attnflow.numerics`) is its tree definition (its class and options: hashable)
    and its arrays; anything else (a plain function) is its own structure, compared by identity,
    with no leaves. ``join_field(structure, leaves)`` is the inverse."""
    leaves, treedef = jax.tree_util.tree_flatten(field)
    if jax.tree_util.treedef_is_leaf(treedef):
        return ByIdentity(field), ()
    return treedef, tuple(leaves)


def join_field(structure, leaves: tuple) -> Any:
    if isinstance(structure, ByIdentity):
        return structure.value
    return jax.tree_util.tree_unflatten(structure, leaves)


def count_trace() -> None:
    """Count one trace of a compiled program (call it inside the traced function: it runs once per
    compilation in this process, never when ``jax.jit`` reuses a program)."""
    _COUNTS["misses"] += 1


def info() -> dict[str, int]:
    """``{"misses"}``: the programs traced (so compiled, or loaded from JAX's persistent cache) by
    ``count_trace`` since the last ``clear``."""
    return dict(_COUNTS)


def clear() -> None:
    """Reset the count and forget every compiled program of this process (``jax.clear_caches``)."""
    jax.clear_caches()
    _COUNTS.update(misses=0)


class _Clock:
    seconds = 0.0


_CLOCKS: list[_Clock] = []
_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


def _on_duration(event: str, duration: float, **_) -> None:
    if event in _COMPILE_EVENTS:
        for clock in _CLOCKS:
            clock.seconds += duration


jax.monitoring.register_event_duration_secs_listener(_on_duration)


@contextlib.contextmanager
def compile_clock() -> Iterator[_Clock]:
    """``with compile_clock() as clock: ...``: ``clock.seconds``, the time JAX spent tracing, lowering
    and compiling programs inside the block (JAX's own duration events; 0 when every program
    was found in ``jax.jit``'s cache)."""
    clock = _Clock()
    _CLOCKS.append(clock)
    try:
        yield clock
    finally:
        _CLOCKS.remove(clock)


persistent_cache_folder = cache_folder  # the one default location (numerics.private_folder)


def enable_persistent_cache(folder: Path | None = None) -> Path | None:
    """Turn on JAX's persistent compilation cache in ``folder`` (default ``persistent_cache_folder()``),
    created private (mode 0o700): a later process of the same shapes loads its programs instead of
    compiling them. JAX writes each entry atomically, so processes may share the folder. Returns
    the folder; None, and nothing turned on, where the default is asked for and
    ``ATTNFLOW_CACHE_DIR=off``."""
    if folder is None and cache_turned_off():
        return None
    folder = check_private_folder(persistent_cache_folder() if folder is None else Path(folder))
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return folder
