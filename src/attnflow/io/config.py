"""Validated run configuration: TOML files, ``--set`` overrides, a stable hash.

A configuration is plain, frozen data: six sections (``model``, ``aux``, ``gauge``, ``factor``,
``init``, ``solver``), each a pydantic model whose defaults are the library's defaults. The parts
live in four modules, gathered here:

- :mod:`attnflow.io.config_schema`: the sections and :class:`Config` (one value's type, range,
  allowed choices, default);
- :mod:`attnflow.io.config_rules`: rules that tie several values together;
- :mod:`attnflow.io.config_errors`: :class:`ConfigError`, one line per problem::

      {where}: `{key}` must be {constraint}; got {value!r}. {hint}

- :mod:`attnflow.io.config_load`: TOML files, overrides, pydantic errors in words, hashing.

Typical use::

    config = load_config("run.toml", overrides=["solver.method=euler", "model.n=128"])
    resolved_dict(config)   # JSON-ready, every default filled in (the run folder's config.json)
    config_hash(config)     # 12 hex characters, stable across processes (names sweep points)
"""

from attnflow.io.config_errors import ConfigError
from attnflow.io.config_load import (
    apply_overrides,
    config_from_dict,
    config_hash,
    load_config,
    override_keys,
    resolved_dict,
)
from attnflow.io.config_schema import (
    AuxConfig,
    Config,
    FactorConfig,
    GaugeConfig,
    InitConfig,
    ModelConfig,
    SolverConfig,
)

__all__ = [
    "AuxConfig",
    "Config",
    "ConfigError",
    "FactorConfig",
    "GaugeConfig",
    "InitConfig",
    "ModelConfig",
    "SolverConfig",
    "apply_overrides",
    "config_from_dict",
    "config_hash",
    "load_config",
    "override_keys",
    "resolved_dict",
]
