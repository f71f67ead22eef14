"""Rules that tie several configuration values together, run once every field is valid.

A rule the library states (:mod:`attnflow.core.constraints`: the time grid, RoPE's frequency
count) is the library's, checked here under the config's keys with a hint
(:func:`attnflow.io.parameters.check_rule`); the library's own checks that need built objects
(a factor or gauge file's values) run when the config is built, reported under its keys too
(:mod:`attnflow.io.parameters`).

Each rule takes a whole :class:`~attnflow.io.config_schema.Config` whose fields are each valid, and
raises a :class:`~attnflow.io.config_errors.ConfigError` naming the key to change. Options that
only matter for one ``kind`` (``init.rho0`` for ``equiangular``, ``gauge.rates`` for
``generalized_rope``, ...) are cross-checked only when that kind is selected. :data:`RULES` lists
them in the order they run; :func:`check_rules` runs them (the ``Config`` validator calls it).
"""

import math
from collections.abc import Callable
from typing import Any

from attnflow.core.constraints import FREQUENCIES, SAVE_EVERY, T_END, whole_steps
from attnflow.io.config_errors import ConfigError, as_lists, either, numbers
from attnflow.io.config_rules_density import (
    DENSITY_METHODS,
    DENSITY_RULES,
    density_reads_only_its_keys,
)
from attnflow.io.parameters import check_rule

__all__ = [
    "DENSITY_METHODS",
    "FIXED_STEP_METHODS",
    "MAX_STEPS",
    "POSITIONAL",
    "RULES",
    "WEIGHT_MAKERS",
    "check_rules",
    "gauge_dim",
]

FIXED_STEP_METHODS = ("euler", "rk4", "geodesic_rk4")
# A fixed-step run of more steps than this would not finish (days of compute even for a tiny n):
# refused before anything starts, naming `solver.dt`.
MAX_STEPS = 10**8


def _file_kinds_have_paths(config) -> None:
    for name in ("aux", "gauge", "factor", "init"):
        section = getattr(config, name)
        if section.kind == "file" and section.path is None:
            raise ConfigError.from_parts(
                f"{name}.path",
                f"a file path when `{name}.kind` = 'file'",
                None,
                hint="Relative paths resolve against the config file's folder.",
            )


def _cap_center_has_d_entries(config) -> None:
    d, init = config.model.d, config.init
    if init.kind == "cap" and len(init.center) != d:
        raise ConfigError.from_parts(
            "init.center",
            f"a list of `model.d` = {d} numbers when `init.kind` = 'cap'",
            list(init.center),
        )


def _equiangular_is_realisable(config) -> None:
    n, d, init = config.model.n, config.model.d, config.init
    if init.kind != "equiangular":
        return
    lower = -1 / (n - 1)
    if not lower < init.rho0 < 1:
        raise ConfigError.from_parts(
            "init.rho0",
            f"in (-1/(n-1), 1) = ({lower:.6g}, 1) for `model.n` = {n}",
            init.rho0,
            hint="rho0 is the common pairwise cosine; -1/(n-1) is the most spread n unit vectors "
            "allow, 1 puts every token at one point.",
        )
    if d < n:
        raise ConfigError.from_parts(
            "init.kind",
            f"'uniform', 'cap' or 'file' when `model.d` = {d} < `model.n` = {n}",
            init.kind,
            hint=f"n unit vectors with pairwise cosine rho0 span n dimensions, so equiangular data "
            f"needs d >= n; use init.kind = 'uniform', or set model.d >= {n}.",
        )


def _nearest_multiple(total: float, step: float) -> str:
    ratio = total / step
    return f"{max(1, round(ratio)) * step if math.isfinite(ratio) else step:.12g}"


def _step_count_is_bounded(config) -> None:
    solver = config.solver
    steps = solver.t_end / solver.dt
    if solver.method in FIXED_STEP_METHODS and steps > MAX_STEPS:
        per_snapshot = solver.save_every / solver.dt
        raise ConfigError.from_parts(
            "solver.dt",
            f"at least `solver.t_end` / {MAX_STEPS:.0e} = {solver.t_end / MAX_STEPS:.3g} (at most "
            f"{MAX_STEPS:.0e} fixed steps)",
            solver.dt,
            hint=f"That is {steps:.3g} steps, {per_snapshot:.3g} per snapshot (`solver.t_end` = "
            f"{solver.t_end!r}, `solver.save_every` = {solver.save_every!r}); raise solver.dt or "
            "lower solver.t_end.",
        )


def _save_every_hint(solver) -> str:
    """A save_every on the step grid that the run's end falls on too (nearest the one asked),
    or, when t_end is off the step grid itself, the pair to change."""
    wanted, steps = solver.save_every / solver.dt, whole_steps(solver.t_end, solver.dt)
    if steps is None:
        every = max(1, round(wanted)) * solver.dt if math.isfinite(wanted) else solver.dt
        return (
            f"Try save_every = {every:.12g} and t_end = {_nearest_multiple(solver.t_end, every)}, "
            "or change solver.dt."
        )
    small = [k for k in range(1, math.isqrt(steps) + 1) if steps % k == 0]
    every = min(small + [steps // k for k in small], key=lambda k: (abs(k - wanted), -k))
    return f"Try save_every = {every * solver.dt:.12g}, or change solver.dt."


def _noise_has_fixed_steps(config) -> None:
    """The noise increment is drawn per fixed step: the adaptive method cannot take it."""
    solver = config.solver
    if config.model.noise > 0 and solver.method not in FIXED_STEP_METHODS:
        raise ConfigError.from_parts(
            "solver.method",
            f"{either(FIXED_STEP_METHODS)} when `model.noise` > 0 (the noise is drawn per step)",
            solver.method,
        )


def _time_grid_is_whole(config) -> None:
    solver = config.solver
    if solver.method in FIXED_STEP_METHODS:
        check_rule(SAVE_EVERY, solver.save_every, dt=solver.dt, hint=_save_every_hint(solver))
    hint = f"Try t_end = {_nearest_multiple(solver.t_end, solver.save_every)}."
    check_rule(T_END, solver.t_end, save_every=solver.save_every, hint=hint)


# kernels that are functions of positions xi: without `aux.kind` written they imply positions
# (attnflow.io.config_load), and with other labels they are refused here
POSITIONAL = {"gauge": ("rope", "generalized_rope"), "factor": ("distance_bias", "toeplitz_cos")}


def _labels_fit_the_kernel(config) -> None:
    aux = config.aux
    if config.gauge.kind == "prompt" and aux.kind != "prompts":
        raise ConfigError.from_parts(
            "aux.kind",
            "'prompts' when `gauge.kind` = 'prompt'",
            aux.kind,
            hint="A prompt gauge gives each prompt id its own rotation; set aux.kind = 'prompts'.",
        )
    for name, positional in POSITIONAL.items():
        kind = getattr(config, name).kind
        if kind in positional and aux.kind not in ("positions", "file"):
            raise ConfigError.from_parts(
                "aux.kind",
                f"'positions' or 'file' when `{name}.kind` = {kind!r}",
                aux.kind,
                hint=f"{name} {kind!r} is a function of positions xi; set aux.kind = 'positions' (or "
                "leave it out).",
            )


def _positions_are_finite(config) -> None:
    spacing, n = config.aux.spacing, config.model.n
    numeric = config.aux.kind == "positions" and not isinstance(spacing, str)
    if numeric and not math.isfinite(spacing * (n - 1)):
        raise ConfigError.from_parts(
            "aux.spacing",
            f"small enough that the last position (n - 1)·spacing is finite (n = {n})",
            spacing,
        )


def _softmax_has_nonnegative_factor(config) -> None:
    """The library's rule (``core.factors.check_softmax_factor``: softmax weights must be
    non-negative) for the one factor whose sign the config alone tells: refused here too, so that
    a sweep refuses such a point when it is planned and ``run`` before JAX is imported, not at the
    build; a file's sign is the library's to check."""
    if config.model.normalization == "sa" and config.factor.kind == "toeplitz_cos":
        raise ConfigError.from_parts(
            "factor.kind",
            "a non-negative factor ('none', 'distance_bias', or 'file' with w >= 0) "
            "when `model.normalization` = 'sa'",
            config.factor.kind,
            hint="Softmax divides row i by sum_k w_ik exp(beta s_ik), which can vanish or turn "
            "negative when w = cos(omega (xi - zeta)) changes sign; use model.normalization = 'usa'.",
        )


def gauge_dim(config) -> int:
    """The dimension the gauge acts on: ``attention.head_dim`` with heads (``model.d`` by default)."""
    attention = config.attention
    if attention is not None and attention.head_dim is not None:
        return attention.head_dim
    return config.model.d


def _rope_frequencies_fit(config) -> None:
    gauge, d = config.gauge, gauge_dim(config)
    if gauge.kind == "rope" and isinstance(gauge.frequencies, tuple):
        heads = config.attention is not None and config.attention.head_dim is not None
        check_rule(
            FREQUENCIES, list(gauge.frequencies), d=d, keys={"d": "attention.head_dim"} if heads else None,
            hint=f"Drop the extra frequencies or raise {'attention.head_dim' if heads else 'model.d'}.",
        )  # fmt: skip


def _preset_sets_the_rope(config) -> None:
    """A preset is a RoPE gauge whose frequencies, base and layout come from a published model, in
    that model's head dimension."""
    gauge = config.gauge
    if gauge.preset is None:
        if gauge.scaling != "preset":
            raise ConfigError.from_parts(
                "gauge.scaling", "left at 'preset' unless `gauge.preset` names a model", gauge.scaling,
                hint="A rule rescales a published model's RoPE: set gauge.preset too (e.g. 'qwen2').",
            )  # fmt: skip
        return
    from attnflow.core.rope_presets import get_preset

    if gauge.kind != "rope":
        raise ConfigError.from_parts("gauge.kind", "'rope' when `gauge.preset` is set", gauge.kind)
    if gauge.frequencies != "full_period" or gauge.base != 10000.0:
        name = "gauge.frequencies" if gauge.frequencies != "full_period" else "gauge.base"
        value = gauge.frequencies if name == "gauge.frequencies" else gauge.base
        raise ConfigError.from_parts(
            name, f"left unset when `gauge.preset` = {gauge.preset!r} (the preset sets it)",
            list(value) if isinstance(value, tuple) else value,
        )  # fmt: skip
    head_dim, d = get_preset(gauge.preset).head_dim, gauge_dim(config)
    if d != head_dim:
        heads = config.attention is not None and config.attention.head_dim is not None
        key = "attention.head_dim" if heads else "model.d"
        raise ConfigError.from_parts(
            key, f"{head_dim}, the head dimension of `gauge.preset` = {gauge.preset!r}", d
        )


# the keys of a context-extension rule beyond `gauge.scaling_factor`: (key, the rules that read it)
SCALING_KEYS = (
    ("original_context", ("yarn", "llama3")),
    ("low_freq_factor", ("llama3",)),
    ("high_freq_factor", ("llama3",)),
    ("beta_fast", ("yarn",)),
    ("beta_slow", ("yarn",)),
)


def _scaling_fits_its_rule(config) -> None:
    """A rule named in `gauge.scaling` takes its factor (required) and the keys it reads; 'preset'
    (the model's rule as published) and 'none' take none of them."""
    from attnflow.core.rope_presets import RULES as SCALING_RULES

    gauge, fields = config.gauge, type(config.gauge).model_fields
    rule = gauge.scaling if gauge.scaling in SCALING_RULES else None
    if rule is None and gauge.scaling_factor is not None:
        raise ConfigError.from_parts(
            "gauge.scaling_factor",
            f"left out unless `gauge.scaling` names a rule ({either(SCALING_RULES)})",
            gauge.scaling_factor,
            hint=f"gauge.scaling = {gauge.scaling!r} takes no factor.",
        )
    if rule is not None and gauge.scaling_factor is None:
        raise ConfigError.from_parts(
            "gauge.scaling_factor",
            f"a number >= 1 when `gauge.scaling` = {rule!r} (the rule's factor s)",
            None,
            hint="For example: scaling_factor = 4.0 (a context four times the original).",
        )
    for name, readers in SCALING_KEYS:
        value = getattr(gauge, name)
        if rule not in readers and value != fields[name].default:
            raise ConfigError.from_parts(
                f"gauge.{name}",
                f"left out unless `gauge.scaling` is a rule that reads it ({either(readers)})",
                value,
                hint=f"gauge.scaling = {gauge.scaling!r} does not read it.",
            )
    pairs = {"llama3": ("high_freq_factor", "low_freq_factor"), "yarn": ("beta_fast", "beta_slow")}
    if rule in pairs:
        upper, lower = pairs[rule]
        if not getattr(gauge, upper) > getattr(gauge, lower):
            bound = getattr(gauge, lower)
            raise ConfigError.from_parts(
                f"gauge.{upper}", f"greater than `gauge.{lower}` = {bound!r}", getattr(gauge, upper)
            )


def _generators_fit(config) -> None:
    gauge, d = config.gauge, gauge_dim(config)
    if gauge.kind != "generalized_rope":
        return
    if gauge.generators is None:
        if d != 3:
            raise ConfigError.from_parts(
                "gauge.axes",
                f"replaced by `gauge.generators` ({d} x {d} skew-symmetric matrices) when `model.d` = {d}",
                list(gauge.axes),
                hint="Axis names 'x', 'y', 'z' name rotations of R^3 only.",
            )
        count, per = len(gauge.axes), "axis in `gauge.axes`"
    else:
        size = len(gauge.generators[0])
        if size != d:
            raise ConfigError.from_parts(
                "gauge.generators",
                f"{d} x {d} matrices to match `model.d` = {d}",
                as_lists(gauge.generators),
                hint=f"The generators given are {size} x {size}.",
            )
        count, per = len(gauge.generators), "matrix in `gauge.generators`"
    if len(gauge.rates) != count:
        raise ConfigError.from_parts(
            "gauge.rates", f"a list of {numbers(count)}, one per {per}", list(gauge.rates)
        )


def _expansion_has_label_structure(config) -> None:
    if config.solver.interaction == "expansion" and config.factor.kind == "file":
        raise ConfigError.from_parts(
            "solver.interaction",
            "'exact' or 'auto' when `factor.kind` = 'file'",
            config.solver.interaction,
            hint="A factor matrix read from a file has no low-rank label structure for the expansion.",
        )


WEIGHT_MAKERS = ("identity", "gaussian", "orthogonal", "shared", "random_qk")


def _sources_leave_movers(config) -> None:
    n, sources = config.model.n, config.model.sources
    if sources >= n:
        raise ConfigError.from_parts(
            "model.sources",
            f"below `model.n` = {n} (at least one token must move)",
            sources,
        )


def _attention_is_consistent(config) -> None:
    attention = config.attention
    if attention is None:
        return
    weights = attention.weights
    if weights not in WEIGHT_MAKERS and not weights.endswith(".npz"):
        raise ConfigError.from_parts(
            "attention.weights",
            f"one of {WEIGHT_MAKERS} or a .npz file",
            weights,
            hint="A file holds the arrays query, key, value (H, d_h, d) and output (H, d, d_h).",
        )
    if config.model.value != "gradient":
        raise ConfigError.from_parts(
            "model.value",
            "'gradient' (the default) with an [attention] section, whose `attention.values` says how "
            "values are read",
            config.model.value,
            hint="Use attention.values = 'plain' for a RoPE layer (values outside the rotation).",
        )
    if attention.alibi and config.factor.kind != "distance_bias":
        raise ConfigError.from_parts(
            "attention.alibi",
            "false unless `factor.kind` = 'distance_bias' (the slopes are per-head distance biases)",
            attention.alibi,
        )
    if config.solver.interaction == "expansion" and config.model.normalization == "sa":
        raise ConfigError.from_parts(
            "solver.interaction",
            "'exact' with heads and model.normalization = 'sa' (the softmax expansion of unbounded "
            "logits needs degrees beyond its limits)",
            config.solver.interaction,
        )


def _layer_norm_state_fits(config) -> None:
    """Pre- and peri-LN tokens ``z`` live in ``R^d``: the noise (defined on the sphere) and the
    geodesic integrator (steps on the sphere) do not apply to them."""
    kind = config.model.layer_norm
    if kind not in ("pre", "peri"):
        return
    if config.model.noise > 0:
        raise ConfigError.from_parts(
            "model.noise",
            f"0 when `model.layer_norm` = {kind!r} (the noise is defined on the sphere; {kind}-LN tokens "
            "z = r x live in R^d)",
            config.model.noise,
            hint="Use model.layer_norm = 'post' or 'ngpt' for a noisy run.",
        )
    if config.solver.method == "geodesic_rk4":
        raise ConfigError.from_parts(
            "solver.method",
            f"'euler', 'rk4' or 'adaptive' when `model.layer_norm` = {kind!r} (geodesic RK4 steps on the "
            f"sphere; {kind}-LN tokens z = r x live in R^d)",
            config.solver.method,
        )


RULES: tuple[Callable[[Any], None], ...] = (
    density_reads_only_its_keys,
    _file_kinds_have_paths,
    _cap_center_has_d_entries,
    _equiangular_is_realisable,
    _step_count_is_bounded,
    _noise_has_fixed_steps,
    _time_grid_is_whole,
    _labels_fit_the_kernel,
    _positions_are_finite,
    _softmax_has_nonnegative_factor,
    _rope_frequencies_fit,
    _preset_sets_the_rope,
    _scaling_fits_its_rule,
    _generators_fit,
    _expansion_has_label_structure,
    _sources_leave_movers,
    _attention_is_consistent,
    _layer_norm_state_fits,
    *DENSITY_RULES,
)


def check_rules(config) -> None:
    """Run every rule of :data:`RULES` on ``config`` (a Config whose fields are each valid)."""
    for rule in RULES:
        rule(config)
