"""Compiled programs kept on disk between processes, found by the structure of the problem.

JAX's persistent compilation cache finds a program by its lowered module: a new process must trace
and lower a program before it can load it (0.2 s for a run's time loop at n = 64, most of what a
warm start spends after its imports). This store finds a program by the key of
:func:`attnflow.numerics.program_cache.compiled` instead, so a warm process loads the executable
without tracing anything.

The key names everything the executable depends on: the key's own text (the problem's structure,
every part written out by value: a part that is only known by identity, such as a plain function,
makes the program one that is not stored), the abstract values of the arguments, the source of
attnflow (a digest of its files), the versions of JAX, jaxlib and NumPy, every JAX configuration
value but those of logging and caching, ``XLA_FLAGS``, the devices, the Python version and the
machine's CPU features. A file is the pickle of the ids of the devices the program runs on and
of ``jax.experimental.serialize_executable.serialize``; it is written atomically, so processes
may share the folder, and one that cannot be read is removed and compiled again.

The programs stored here are compiled fresh, never loaded from JAX's cache: on the CPU backend an
executable that JAX loaded from its cache serializes into one that fails when called. So they are
compiled with an option that JAX's cache key sees (set to its default value, so the program is the
same) and JAX is told not to keep them.

The store lives in ``programs/`` inside JAX's compilation cache folder (where JAX's own cache,
whose entries are the folder's ``*-cache`` files, leaves it alone) and is used whenever that folder
is set (:func:`attnflow.numerics.program_cache.enable_persistent_cache`, or
``JAX_COMPILATION_CACHE_DIR``).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import os
import pickle
import platform
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import jax
import jaxlib
import numpy as np
from jax.experimental import serialize_executable

FOLDER_NAME = "programs"
# Set to XLA's default, so the program is unchanged; it only makes JAX's cache key differ from
# that of the same program compiled without the store (see the module docstring).
COMPILER_OPTIONS = {"xla_embed_ir_in_executable": False}


# JAX settings that change what JAX logs or caches, never a compiled program
_NOT_IN_PROGRAMS = frozenset(
    {
        "jax_log_compiles",
        "jax_explain_cache_misses",
        "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes",
    }
)


def folder() -> Path | None:
    """The store's folder, or None when no compilation cache folder is set (or JAX's compilation
    cache is turned off, ``jax_enable_compilation_cache``)."""
    base = jax.config.jax_compilation_cache_dir
    if not base or not jax.config.jax_enable_compilation_cache:
        return None
    return Path(base) / FOLDER_NAME


def key_text(value) -> str | None:
    """A text naming ``value`` by value, the same in every process; None where ``value`` (or a part
    of it) is known only by identity (a function, an object shown by its address)."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, (tuple, list)):
        parts = [key_text(item) for item in value]
        return None if None in parts else f"{type(value).__name__}({', '.join(parts)})"
    if isinstance(value, type):
        return f"type:{value.__module__}.{value.__qualname__}"
    if isinstance(value, enum.Enum):
        return f"enum:{type(value).__module__}.{type(value).__qualname__}.{value.name}"
    if isinstance(value, (np.generic, np.dtype)):
        return f"numpy:{value!r}"
    if isinstance(value, (jax.tree_util.PyTreeDef, jax.core.ShapedArray)):
        text = repr(value)
        return None if " at 0x" in text else f"jax:{text}"
    if dataclasses.is_dataclass(value):
        cls = key_text(type(value))
        parts = [key_text(getattr(value, item.name)) for item in dataclasses.fields(value)]
        return None if None in parts else f"{cls}({', '.join(parts)})"
    return None


@functools.cache
def _cpu_features() -> str:
    """The CPU's feature flags where the platform lists them (Linux), else the machine's name: an
    executable compiled for one CPU may use instructions that another lacks."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def _source_digest() -> str:
    """A digest of attnflow's Python files (their paths and contents)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _environment_text() -> str:
    """Everything outside the key that the compiled executable depends on."""
    devices = jax.devices()
    return "\n".join(
        [
            f"python {sys.version}",
            f"jax {jax.__version__} jaxlib {jaxlib.__version__} numpy {np.__version__}",
            f"attnflow source {_source_digest()}",
            f"platform {devices[0].platform} {devices[0].client.platform_version}",
            f"devices {[(device.id, device.device_kind) for device in devices]}",
            f"config {sorted(i for i in jax.config.values.items() if i[0] not in _NOT_IN_PROGRAMS)!r}",
            f"XLA_FLAGS {os.environ.get('XLA_FLAGS', '')}",
            f"cpu {_cpu_features()}",
        ]
    )


def path_for(text: str) -> Path | None:
    """The file of the program of this key text in this environment (None without a folder)."""
    base = folder()
    if base is None:
        return None
    name = hashlib.sha256(f"{_environment_text()}\n{text}".encode()).hexdigest()
    return base / f"{name}.program"


def _trusted(path: Path) -> bool:
    """Whether ``path`` and its folder belong to this user and no one else may write them: a file is
    unpickled, so one that another user could have written is not read (POSIX; elsewhere, true)."""
    if not hasattr(os, "getuid"):
        return True
    for item in (path.parent, path):
        info = item.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            return False
    return True


def load(path: Path):
    """The executable stored at ``path``, or None if there is none, if it is not :func:`_trusted`, or
    if it cannot be read (then the file is removed); the caller then compiles the program."""
    try:
        if not _trusted(path):
            return None
        blob = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        device_ids, serialized = pickle.loads(blob)
        by_id = {device.id: device for device in jax.devices()}
        devices = [by_id[i] for i in device_ids]
        return serialize_executable.deserialize_and_load(*serialized, execution_devices=devices)
    except Exception:  # a damaged file is only a missed shortcut: compile instead
        path.unlink(missing_ok=True)
        return None


def compile_and_store(path: Path, build: Callable[[], Callable], args: tuple):
    """Compile ``build()`` for ``args`` fresh (not from JAX's cache, which is not written either) and
    store it at ``path``; returns the executable. A program that cannot be serialized is only
    not stored."""
    keep = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
    try:
        executable = jax.jit(build()).lower(*args).compile(compiler_options=COMPILER_OPTIONS)
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", keep)
    try:
        device_ids = [device.id for device in executable.runtime_executable().local_devices()]
        blob = pickle.dumps((device_ids, serialize_executable.serialize(executable)))
    except (TypeError, ValueError, AttributeError, pickle.PicklingError, jax.errors.JaxRuntimeError):
        return executable
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # renamed into place, so a reader never sees half a file; not flushed to disk (as
    # attnflow.io.atomic does for results): a file lost in a crash only costs a compilation
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.write_bytes(blob)
        tmp.chmod(0o600)  # private whatever the umask (a file others may write is not read)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return executable
