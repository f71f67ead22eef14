"""The library's parameters and the config keys they come from: one table for the messages.

The library validates its own arguments, under its own names, in one template
(``{where}: `{name}` must be {constraint}; got {value!r}.``): ``make_vector_field`` refuses
``normalization = "sa"`` with a sign-changing factor, ``make_rope`` more frequencies than
``d // 2``, and so on. A config becomes those arguments in one place
(:mod:`attnflow.workflows.build`); an error the library raises there is reported under the config
key its parameter came from (:data:`CONFIG_KEYS`), so that the check is written once, in the
library, and the message still names what to change in the file::

    dynamics: `normalization` 'sa' requires a non-negative factor ...
    config: `model.normalization` 'sa' requires a non-negative factor ...

A parameter the table does not name (or a message outside the template) is reported as it is,
after ``config:``.

A rule that ties parameters together (:mod:`attnflow.core.constraints`: the time grid, RoPE's
frequency count) imports no JAX; a config checks it before anything is imported, with the same
predicate and the same words under its keys (:func:`check_rule`)::

    solve: `save_every` must be a whole multiple of `dt` = 0.1; got 0.25.
    config: `solver.save_every` must be a whole multiple of `solver.dt` = 0.1; got 0.25. Try ...
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from typing import Any

from attnflow.core.constraints import Rule
from attnflow.io.config_errors import ConfigError

__all__ = ["CONFIG_KEYS", "as_config_error", "check_rule", "library_errors"]

# library parameter -> the config key it is built from (attnflow.workflows.build)
CONFIG_KEYS: dict[str, str] = {
    # the kernel and the dynamics (core.kernel, numerics.dynamics)
    "n": "model.n",
    "d": "model.d",
    "beta": "model.beta",
    "normalization": "model.normalization",
    "causal": "model.causal",
    "value": "model.value",
    "noise": "model.noise",
    "sources": "model.sources",
    # labels, gauges and factors (core.gauges, core.factors)
    "xi": "aux.kind",
    "frequencies": "gauge.frequencies",
    "base": "gauge.base",
    "generators": "gauge.generators",
    "rates": "gauge.rates",
    "omega": "gauge.omega",
    "q": "gauge.path",
    "w": "factor.path",
    "slope": "factor.slope",
    # the initial data and the solver (core.sphere, numerics.solve)
    "x0": "init.path",
    "sigma": "init.sigma",
    "rho0": "init.rho0",
    "dt": "solver.dt",
    "t_end": "solver.t_end",
    "save_every": "solver.save_every",
    "rtol": "solver.rtol",
    "atol": "solver.atol",
    "max_steps": "solver.max_steps",
    "block_size": "solver.block_size",
    "interaction": "solver.interaction",
    "tolerance": "solver.tolerance",
}

_TEMPLATE = re.compile(r"^[\w .-]+: `(?P<name>[\w.]+)`(?P<rest>.+)$")


def as_config_error(error: ValueError, *, context: str | None = None) -> ConfigError:
    """``error`` (the library's) as a :class:`ConfigError` naming the config key of its parameter;
    with ``context`` (``"`solver.interaction` = 'expansion'"``: the key whose choice led there),
    the library's line after it. A :class:`ConfigError` is returned as it is."""
    if isinstance(error, ConfigError):
        return error
    text = " ".join(str(error).split())
    if context is not None:
        return ConfigError(f"config: {context}: {text}")
    match = _TEMPLATE.match(text)
    key = match and CONFIG_KEYS.get(match["name"])
    if key:
        return ConfigError(f"config: `{key}`{match['rest']}")
    return ConfigError(f"config: {text}")


@contextlib.contextmanager
def library_errors(context: str | None = None) -> Iterator[None]:
    """The library's ``ValueError`` raised in the block, as :func:`as_config_error`."""
    try:
        yield
    except ValueError as error:
        raise as_config_error(error, context=context) from error


def check_rule(
    rule: Rule, value: Any, *, hint: str = "", keys: Mapping[str, str] | None = None, **others: Any
) -> None:
    """Raise a :class:`ConfigError` naming config keys unless ``value`` keeps the library's
    ``rule`` (``others``: the values of the parameters it ties ``value`` to). ``keys``: config
    keys that differ from :data:`CONFIG_KEYS` here (``d``: ``attention.head_dim`` with heads)."""
    names = {**CONFIG_KEYS, **(keys or {})}
    constraint = rule.broken(value, names=names, **others)
    if constraint is not None:
        raise ConfigError.from_parts(names[rule.parameter], constraint, value, hint=hint)
