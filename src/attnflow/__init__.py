"""attnflow: mean-field self-attention dynamics with frozen auxiliary variables.

Importing the package enables float64 in JAX (the library's default precision; float32 is a
per-run option) without importing JAX itself: the public names below are loaded on first use, so
``import attnflow`` and the command line's ``--help`` stay fast. Call ``attnflow.use_cpu_cores()``
before the first computation to run large tiled evaluations on every CPU core
(``attnflow.numerics.lanes``; the results are the same either way). The names below are the main
public objects; the layers hold the functions: ``attnflow.core`` (the mathematics),
``attnflow.numerics`` (how it is computed), ``attnflow.analysis`` (diagnostics and theory),
``attnflow.io`` (config, storage), ``attnflow.viz`` (figures), ``attnflow.workflows`` (the
commands' bodies). Plotting is not imported here.
"""

import importlib
import os
import sys


def _enable_x64() -> None:
    """float64 in JAX for the whole process, before any JAX computation.

    Every module of the package runs this file first, so it covers every path into JAX. When JAX is
    already imported, its flag is set directly; otherwise ``JAX_ENABLE_X64`` is set, which JAX reads
    when it is first imported (and which worker processes inherit).
    """
    if "jax" in sys.modules:
        sys.modules["jax"].config.update("jax_enable_x64", True)
    else:
        os.environ["JAX_ENABLE_X64"] = "1"


_enable_x64()

_PUBLIC = {  # name -> the module that defines it
    "Kernel": "attnflow.core.kernel",
    "get_preset": "attnflow.core.rope_presets",
    "Profile": "attnflow.core.kernel",
    "make_profile": "attnflow.core.kernel",
    "Config": "attnflow.io.config",
    "ConfigError": "attnflow.io.config",
    "config_from_dict": "attnflow.io.config",
    "load_config": "attnflow.io.config",
    "__version__": "attnflow.io.version",
    "make_vector_field": "attnflow.numerics.dynamics",
    "RK4": "attnflow.numerics.integrators",
    "Adaptive": "attnflow.numerics.integrators",
    "Euler": "attnflow.numerics.integrators",
    "GeodesicRK4": "attnflow.numerics.integrators",
    "make_integrator": "attnflow.numerics.integrators",
    "use_cpu_cores": "attnflow.numerics.lanes",
    "LayerNormField": "attnflow.numerics.layer_norms",
    "Placement": "attnflow.numerics.placement",
    "ShardedField": "attnflow.numerics.sharding",
    "TokenMesh": "attnflow.numerics.sharding",
    "make_token_mesh": "attnflow.numerics.sharding",
    "shard_tokens": "attnflow.numerics.sharding",
    "SaveAt": "attnflow.numerics.saving",
    "Trajectory": "attnflow.numerics.solve",
    "solve": "attnflow.numerics.solve",
    "solve_streaming": "attnflow.numerics.solve",
    "integrate": "attnflow.numerics.solve",
    "integrate_adaptive": "attnflow.numerics.differentiable",
    "Status": "attnflow.numerics.status",
    "AdaptiveSteps": "attnflow.numerics.steps",
    "ConstantSteps": "attnflow.numerics.steps",
    "energy": "attnflow.numerics.summation",
    "Simulation": "attnflow.workflows.build",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    """Load a public name from its module on first use (PEP 562) and keep it here."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'attnflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
