"""Keys that the chosen kind does not read: refused, so that a setting never silently does nothing.

``factor.path`` with ``factor.kind = "none"``, ``gauge.omega`` with RoPE or ``solver.atol`` with
``rk4`` change nothing in the run, yet they change the config's hash (the run folder's name) and
they say that the writer expects an effect. :data:`IGNORED` lists, for each choice of a selecting
key (``aux.kind``, ``gauge.kind``, ``factor.kind``, ``init.kind``, ``solver.method``,
``solver.interaction``, ``gauge.frequencies``, ``model.beta_scaling``, ``attention.weights``,
``model.layer_norm``), the keys of its section that
this choice does not read; :func:`check_unused` refuses a key written in the file or by ``--set``
that the chosen value ignores, naming the choices that do read it.

Refused rather than warned: the fix is one deleted line, a warning scrolls away while the run
goes on under a hash that differs from the same run without the key, and an unknown key is refused
too. What is refused is a key written with a value other than its default: a key written at its
default (a file that lists every key, as the reference does) changes neither the run nor the hash.
Only keys written are checked, when the config is loaded from a file (``load_config``), for each
point of a sweep taken as a whole (:mod:`attnflow.workflows.sweep_plan`: a grid may change a kind)
and for the key a landscape continues; and only keys listed here: a section or key this table does
not name is never refused.

A ``[density]`` section selects the whole model: the density has no tokens, no initial points, no
noise, no masks and no store of points, so :data:`DENSITY_IGNORED` lists the keys of the other
sections that it does not read, refused in the same way (a non-default value, naming the key) by
:func:`check_density_unused`. It reads the config alone (a key not written is at its default), so
it runs as the first rule of :mod:`attnflow.io.config_rules`: before any rule about those keys, for
a file and for a dict alike.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from attnflow.io.config_errors import ConfigError, either

__all__ = ["DENSITY_IGNORED", "IGNORED", "LIST", "check_density_unused", "check_unused"]

LIST = "a list"  # the choice of `gauge.frequencies` when it is an explicit list
FILE = "a file"  # the choice of `attention.weights` when it names a .npz file

_GAUGE_PARAMETERS = (
    "frequencies",
    "base",
    "axes",
    "generators",
    "rates",
    "omega",
    "seed",
    "path",
    "preset",
    "scaling",
)

# (section, selecting key) -> {choice: keys of the section that this choice does not read}; every
# choice is listed (the hint names the choices that read a key)
IGNORED: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {
    ("aux", "kind"): {
        "none": ("spacing", "n_prompts", "assignment", "seed", "path"),
        "positions": ("n_prompts", "assignment", "seed", "path"),
        "prompts": ("spacing", "path"),
        "file": ("spacing", "n_prompts", "assignment", "seed"),
    },
    ("gauge", "kind"): {
        "none": _GAUGE_PARAMETERS,
        "rope": ("axes", "generators", "rates", "omega", "seed", "path"),
        "generalized_rope": ("frequencies", "base", "seed", "path", "preset", "scaling"),
        "prompt": (
            "frequencies",
            "base",
            "axes",
            "generators",
            "rates",
            "omega",
            "path",
            "preset",
            "scaling",
        ),
        "file": tuple(key for key in _GAUGE_PARAMETERS if key != "path"),
    },
    ("gauge", "frequencies"): {  # RoPE's base only sets the 'roformer' frequencies
        "roformer": (),
        "full_period": ("base",),
        LIST: ("base",),
    },
    ("factor", "kind"): {
        "none": ("slope", "omega", "path"),
        "distance_bias": ("omega", "path"),
        "toeplitz_cos": ("slope", "path"),
        "file": ("slope", "omega"),
    },
    ("init", "kind"): {  # init.seed is read by every kind: it also seeds the noise
        "uniform": ("center", "sigma", "rho0", "path"),
        "cap": ("rho0", "path"),
        "equiangular": ("center", "sigma", "path"),
        "file": ("center", "sigma", "rho0"),
    },
    ("solver", "method"): {
        "euler": ("rtol", "atol", "max_steps"),
        "rk4": ("rtol", "atol", "max_steps"),
        "geodesic_rk4": ("rtol", "atol", "max_steps"),
        "adaptive": (),
    },
    ("solver", "interaction"): {
        "exact": ("tolerance",),
        "expansion": (),
        "auto": (),
    },
    ("model", "beta_scaling"): {  # beta as given, or gamma log n
        "none": ("gamma",),
        "log_n": ("beta",),
    },
    ("attention", "weights"): {  # the scale and seed of the random maps
        "identity": ("scale", "seed"),
        "gaussian": (),
        "orthogonal": (),
        "shared": (),
        "random_qk": (),
        FILE: ("scale", "seed"),
    },
    ("model", "layer_norm"): {  # nGPT's step scale
        "post": ("ngpt_alpha",),
        "pre": ("ngpt_alpha",),
        "peri": ("ngpt_alpha",),
        "ngpt": (),
    },
    ("density", "init"): {  # the uniform law's wave, the mixture, or the file
        "uniform": ("centers", "kappa", "weights", "path"),
        "vmf": ("amplitude", "mode", "seed", "path"),
        "file": ("amplitude", "mode", "seed", "centers", "kappa", "weights"),
    },
}

# With a [density] section: the keys of the particle model a density does not read (section -> keys)
DENSITY_IGNORED: dict[str, tuple[str, ...]] = {
    "model": (
        "n", "beta_scaling", "gamma", "causal", "value", "noise", "sources", "layer_norm", "ngpt_alpha",
    ),
    "aux": ("spacing", "assignment", "seed"),
    "init": ("kind", "seed", "center", "sigma", "rho0", "path"),
    "solver": ("dtype", "block_size", "interaction", "tolerance"),
    "storage": ("token_stride", "dtype", "snapshots"),
}  # fmt: skip
_DENSITY_WHY = {
    "model": "a density has no tokens, masks, sources or noise, and its layer norm is post",
    "aux": "a density's positions are the uniform law on [0, 1) and its prompts have equal masses",
    "init": "the density's initial law is set in [density]",
    "solver": "a density runs in float64, without blocks or the expansion",
    "storage": "a density stores every snapshot of its law",
}

# a selector that only matters under a choice of another key: (section, key) -> (key, choices)
_ONLY_UNDER = {("gauge", "frequencies"): ("kind", ("rope",))}


def _choice(value: Any, table: Mapping[Any, Any]) -> Any:
    if not isinstance(value, str):
        return LIST
    return value if value in table else FILE


def check_unused(
    data: Mapping[str, Any],
    config: Any,
    *,
    where: str,
    overridden: Collection[str] = (),
    override_where: str = "--set",
) -> None:
    """Refuse a key written in ``data`` (the merged file and ``--set`` values), with a value other
    than its default, that ``config``'s chosen kind ignores. ``overridden``: the dotted keys given
    by ``--set`` (reported for ``override_where``; the others for ``where``, the file)."""
    for (section, selector), table in IGNORED.items():
        written = data.get(section)
        if not isinstance(written, Mapping):
            continue
        settings = getattr(config, section, None)
        if settings is None:
            continue
        guard = _ONLY_UNDER.get((section, selector))
        if guard is not None and getattr(settings, guard[0]) not in guard[1]:
            continue  # the selector itself is ignored (and reported as such, if written)
        choice = _choice(getattr(settings, selector), table)
        fields = type(settings).model_fields
        for name in table.get(choice, ()):
            if name in written and name in fields and getattr(settings, name) != fields[name].default:
                raise _unused_error(
                    section, selector, choice, name, written[name], table,
                    where=override_where if f"{section}.{name}" in overridden else where,
                )  # fmt: skip


def check_density_unused(config: Any, *, where: str = "config") -> None:
    """With a ``[density]`` section, refuse a key of :data:`DENSITY_IGNORED` whose value is not its
    default, naming it (``where``: the file, as the other refusals)."""
    if getattr(config, "density", None) is None:
        return
    for section, names in DENSITY_IGNORED.items():
        settings = getattr(config, section)
        fields = type(settings).model_fields
        for name in names:
            value = getattr(settings, name)
            if value != fields[name].default:
                raise ConfigError.from_parts(
                    f"{section}.{name}",
                    f"left out with a [density] section ({_DENSITY_WHY[section]})",
                    list(value) if isinstance(value, tuple) else value,
                    hint="Remove it, or the [density] section to run particles.",
                    where=where,
                )


def _unused_error(
    section: str, selector: str, choice: Any, name: str, value: Any, table: Mapping[str, Any], *, where: str
) -> ConfigError:
    readers = [other for other, ignored in table.items() if name not in ignored and other not in (LIST, FILE)]
    shown = choice if choice in (LIST, FILE) else repr(choice)
    hint = "Remove it."
    if readers:
        hint = f"Remove it; it is read when `{section}.{selector}` is {either(readers)}."
    return ConfigError.from_parts(
        f"{section}.{name}",
        f"left out when `{section}.{selector}` = {shown} (which does not read it)",
        value,
        hint=hint,
        where=where,
    )
