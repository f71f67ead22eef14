"""From a validated ``Config`` to the runtime objects, built once (STYLE: config → arrays → solve).

``build(config)`` is the only reader of a config: it turns the sections into frozen labels ``xi``,
a ``Kernel`` (gauge × factor × profile), the vector field, the initial data and the integrator,
and returns them as a ``Simulation``. Everything downstream receives arrays and pytrees.

Input read from files (labels, gauges, factors, initial data) is checked here and rejected with a
``ConfigError`` naming the key: wrong shape, non-finite values, non-orthogonal gauges,
non-symmetric factors, and (for a causal run) positions that are not in token order.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.core import factors, gauges, rope_presets, sphere
from attnflow.core.heads import head_norms
from attnflow.core.host import to_device
from attnflow.core.kernel import Kernel, make_profile
from attnflow.io.arrays import ArrayFileError, load_array
from attnflow.io.config import Config, ConfigError
from attnflow.io.parameters import library_errors
from attnflow.numerics import placement
from attnflow.numerics.dynamics import VectorField, make_vector_field
from attnflow.numerics.expansion import MAX_RANK, expansion_rank
from attnflow.numerics.heads_field import HeadsField
from attnflow.numerics.integrators import Integrator, make_integrator
from attnflow.numerics.layer_norms import LayerNormField
from attnflow.numerics.saving import SNAPSHOT_GROUP_MAX, snapshot_count
from attnflow.numerics.summation import symmetric_tiles
from attnflow.workflows.build_heads import make_heads

# Automatic blocking (benchmarks/RESULTS.md; 2 cores, one field evaluation).
# float64: above AUTO_BLOCK_THRESHOLD tokens, symmetric tiles of AUTO_BLOCK_SIZE × AUTO_BLOCK_SIZE
# (memory O(n d + block²) whatever n), dealt into lanes (attnflow.numerics.lanes); the dense path
# writes n × n arrays and falls behind above a few hundred tokens. The tile size is fixed (not
# derived from the core count): it sets the summation order, hence the rounding.
# float32: the dense path keeps up to AUTO_BLOCK_THRESHOLD_FLOAT32 tokens; above, row blocks of at
# most AUTO_BLOCK_ROWS_FLOAT32 rows and about AUTO_BLOCK_ENTRIES kernel entries (memory O(n · block)).
AUTO_BLOCK_THRESHOLD = 512
AUTO_BLOCK_SIZE = 128
AUTO_BLOCK_THRESHOLD_FLOAT32 = 2048
AUTO_BLOCK_ROWS_FLOAT32 = 512
AUTO_BLOCK_ENTRIES = 2**22  # float32 row blocks: 16 MB per n × block array
AUTO_BLOCK_MIN = 16


@dataclasses.dataclass(frozen=True)
class Simulation:
    """Everything a run needs, built from a config: arrays and pytrees, no config inside."""

    kernel: Kernel
    field: VectorField
    x0: jax.Array
    xi: np.ndarray
    groups: np.ndarray | None  # prompt ids, for the conditional spread
    integrator: Integrator
    dt: float
    t_end: float
    save_every: float
    noise: float
    key: jax.Array
    block_size: int | None
    interaction: str = "exact"  # the path that runs ("auto" resolved)
    rank: int | None = None  # features per token of the expansion; None for "exact"
    max_steps: int | None = None  # the adaptive solver's bound on a whole run (solver.max_steps)
    layer_norm: str = "post"  # model.layer_norm; for pre and peri the state is z = r x in R^d
    attention_factor: float | None = None  # a preset RoPE's factor on q and k (β·f² ran); None: no preset

    @property
    def radial(self) -> bool:
        """Whether the state is ``z = r x`` in ``R^d`` with a radius per token (pre-, peri-LN)."""
        return self.layer_norm in ("pre", "peri")


@jax.jit
def noise_key(seed):
    """The noise stream of a run, ``fold_in(key(seed), 1)``: one compiled program for every seed."""
    return jax.random.fold_in(jax.random.key(seed), 1)


def _fail(key: str, constraint: str, value) -> ConfigError:
    return ConfigError.from_parts(key, constraint, value)


def _load_array(key: str, path, shape: tuple[int | None, ...] | None = None) -> np.ndarray:
    """The array of the file named by ``key`` (:func:`attnflow.io.arrays.load_array`); check its
    shape (``None`` = any size) and finiteness."""
    try:
        array = load_array(path)
    except ArrayFileError as error:
        raise ConfigError.from_parts(key, error.constraint, error.value) from None
    if shape is None:  # labels: (n,) or (n, k)
        shape = (None,) * array.ndim if array.ndim in (1, 2) else (None, None)
    ok = array.ndim == len(shape) and all(
        s is None or s == a for s, a in zip(shape, array.shape, strict=False)
    )
    if not ok:
        wanted = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise _fail(key, f"an array of shape {wanted}", f"{path} with shape {array.shape}")
    if not np.all(np.isfinite(array)):
        bad = int(np.sum(~np.isfinite(array)))
        raise _fail(key, "finite everywhere", f"{path} with {bad} non-finite entries")
    return array.astype(np.float64)


def model_beta(config: Config) -> float:
    """The β of the dynamics: ``model.beta``, or ``γ log n`` with ``model.beta_scaling = "log_n"``."""
    model = config.model
    return model.gamma * math.log(model.n) if model.beta_scaling == "log_n" else model.beta


def rope_scaling(config: Config) -> rope_presets.Scaling | None:
    """The context-extension rule in effect on a preset's RoPE: the preset's own
    (``gauge.scaling = "preset"``; None for a model without one), None (``"none"``, or no preset),
    or the rule named in ``gauge.scaling`` with its factor, original context (unset: the preset's
    context) and parameters, applied to the model's unscaled frequencies."""
    g = config.gauge
    if g.kind != "rope" or g.preset is None or g.scaling == "none":
        return None
    preset = rope_presets.get_preset(g.preset)
    if g.scaling == "preset":
        return preset.scaling
    return rope_presets.Scaling(
        g.scaling,
        g.scaling_factor,
        preset.context if g.original_context is None else g.original_context,
        low_freq_factor=g.low_freq_factor,
        high_freq_factor=g.high_freq_factor,
        beta_fast=g.beta_fast,
        beta_slow=g.beta_slow,
    )


def rope_attention_factor(config: Config) -> float:
    """The factor the RoPE scaling in effect puts on queries and keys: YaRN's ``0.1 ln s + 1``, else 1."""
    scaling = rope_scaling(config)
    if scaling is None:  # attention_factor(preset, None) would read the preset's own rule
        return 1.0
    return rope_presets.attention_factor(rope_presets.get_preset(config.gauge.preset), scaling)


def dynamics_beta(config: Config) -> float:
    """The β that runs: :func:`model_beta` times the square of :func:`rope_attention_factor` (YaRN
    scales queries and keys by ``f``, so the logits ``β⟨q, k⟩`` by ``f²``; the other rules by 1)."""
    return model_beta(config) * rope_attention_factor(config) ** 2


def make_labels(config: Config) -> np.ndarray:
    """Frozen auxiliary labels ``xi``: positions, prompt ids, or a file (``(n,)`` or ``(n, k)``)."""
    aux, n = config.aux, config.model.n
    index = np.arange(n, dtype=np.float64)
    if aux.kind == "none":
        return np.zeros(n)
    if aux.kind == "positions":
        steps = {"index": 1.0, "unit": 1.0 / n}
        if aux.spacing == "midpoint":
            return (index + 0.5) / n
        return index * (steps[aux.spacing] if isinstance(aux.spacing, str) else float(aux.spacing))
    if aux.kind == "prompts":
        if aux.assignment == "cyclic":
            return (index % aux.n_prompts).astype(np.float64)
        key = jax.random.key(aux.seed)
        return np.asarray(jax.random.randint(key, (n,), 0, aux.n_prompts)).astype(np.float64)
    xi = _load_array("aux.path", aux.path)
    if xi.shape[0] != n:
        raise _fail("aux.path", f"labels for n = {n} tokens, shape (n,) or (n, k)", f"shape {xi.shape}")
    if config.model.causal is not False or config.model.sources:
        check_causal_order(xi)
    return xi


def check_causal_order(xi: np.ndarray) -> None:
    """A causal run lets token ``i`` see the tokens ``j <= i``: token order must be position order.

    Scalar labels read from a file (``aux.path``, shape ``(n,)``) are positions and must be
    non-decreasing in token order; otherwise the mask would follow the file's order, not the
    positions (generated positions are increasing by construction).
    """
    if xi.ndim != 1:  # vector labels carry no order of their own: the mask is the token order
        return
    down = np.flatnonzero(np.diff(xi) < 0)
    if down.size:
        i = int(down[0])
        raise ConfigError.from_parts(
            "aux.path",
            "non-decreasing in token order with model.causal or model.sources (masks and held "
            "sources follow the token order)",
            f"xi[{i}] = {xi[i]:g} > xi[{i + 1}] = {xi[i + 1]:g}",
            hint="Sort the tokens by position (and reorder any per-token input the same way).",
        )


def _scalar_labels(xi: np.ndarray, key: str) -> np.ndarray:
    if xi.ndim != 1:
        raise _fail(key, "used with scalar labels (aux of shape (n,))", f"labels of shape {xi.shape}")
    return xi


def make_gauge(config: Config, xi: np.ndarray, dtype, *, d: int | None = None) -> gauges.Gauge:
    """The gauge of the config in dimension ``d`` (default ``model.d``; a head's ``d_h``)."""
    g, n = config.gauge, config.model.n
    d = config.model.d if d is None else d
    if g.kind == "none":
        return gauges.IdentityGauge(n=n, d=d)
    if g.kind == "rope" and g.preset is not None:
        preset, scaling = rope_presets.get_preset(g.preset), rope_scaling(config)
        if scaling is None:
            freqs = rope_presets.base_frequencies(preset)
        else:
            freqs = rope_presets.scaled_frequencies(preset, scaling)
        xi = _scalar_labels(xi, "gauge.kind")
        return gauges.make_rope(xi, d, freqs, dtype=dtype, layout=preset.layout)
    if g.kind == "rope":
        freqs = gauges.rope_frequencies(d, kind=g.frequencies, n=n, base=g.base)
        return gauges.make_rope(_scalar_labels(xi, "gauge.kind"), d, freqs, dtype=dtype)
    if g.kind == "generalized_rope":
        generators = g.generators if g.generators is not None else [gauges.axis_generator(a) for a in g.axes]
        omega = 2.0 * math.pi / n if g.omega == "full_period" else float(g.omega)
        xi = _scalar_labels(xi, "gauge.kind")
        return gauges.make_generalized_rope(xi, generators, g.rates, omega=omega, dtype=dtype)
    if g.kind == "prompt":
        q_prompts = gauges.haar_orthogonal(g.seed, config.aux.n_prompts, d)
        return gauges.make_prompt_gauge(xi.astype(int), q_prompts, dtype=dtype)
    q = _load_array("gauge.path", g.path, (n, d, d))
    with library_errors():
        q = gauges.check_orthogonal(q, name="gauge.path")
    return gauges.DenseGauge(q=to_device(q, dtype))


def make_factor(config: Config, xi: np.ndarray, dtype, *, slope: float | None = None) -> factors.Factor:
    """The factor of the config (``slope`` replaces ``factor.slope``: a head's ALiBi slope)."""
    f, n = config.factor, config.model.n
    if f.kind == "none":
        return factors.NoFactor(n=n)
    if f.kind == "distance_bias":
        xi = to_device(_scalar_labels(xi, "factor.kind"), dtype)
        return factors.DistanceBias(xi=xi, slope=to_device(f.slope if slope is None else slope, dtype))
    if f.kind == "toeplitz_cos":
        xi = to_device(_scalar_labels(xi, "factor.kind"), dtype)
        return factors.ToeplitzCos(xi=xi, omega=to_device(f.omega, dtype))
    w = _load_array("factor.path", f.path, (n, n))
    with library_errors():  # with normalization 'sa', make_vector_field refuses a sign-changing w
        return factors.make_matrix_factor(w, n=n, dtype=dtype)


def make_initial(config: Config, gauge: gauges.Gauge, dtype) -> jax.Array:
    """Initial data; a cap and equiangular data are made in the gauge frame (``x0_i = Q(ξ_i)ᵀ u0_i``:
    the gauge frame of equiangular data is equiangular, as the reduction under every norm needs)."""
    init, n, d = config.init, config.model.n, config.model.d
    key = init.seed  # NumPy's PCG64 stream: the same initial data as a NumPy reference code
    if init.kind == "uniform":
        return sphere.sample_uniform(key, n, d, dtype=dtype)
    if init.kind == "cap":
        u0 = sphere.sample_cap(key, n, init.center, sigma=init.sigma, dtype=dtype)
        return gauge.apply_transpose(u0)
    if init.kind == "equiangular":
        return gauge.apply_transpose(sphere.equiangular(n, d, init.rho0, dtype=dtype))
    x0 = _load_array("init.path", init.path, (n, d))
    # Each row scaled by its largest entry first: rows near the float64 maximum (~1e308) would
    # overflow the norm and become zero rows; the direction is unchanged.
    largest = np.max(np.abs(x0), axis=1, keepdims=True)
    x0 = x0 / np.where(largest > 0, largest, 1.0)
    norms = np.linalg.norm(x0, axis=1)
    if np.any(norms == 0):
        raise _fail("init.path", "free of zero rows (points are normalised onto the sphere)", str(init.path))
    return to_device(x0 / norms[:, None], dtype)


def auto_block_size(n: int, dtype=jnp.float64) -> int | None:
    """The automatic block size for ``n`` tokens. float64: ``None`` (dense) up to
    ``AUTO_BLOCK_THRESHOLD``, then ``AUTO_BLOCK_SIZE`` (the tile edge). float32: dense up to
    ``AUTO_BLOCK_THRESHOLD_FLOAT32``, then row blocks: the largest power of two
    ``<= min(AUTO_BLOCK_ROWS_FLOAT32, AUTO_BLOCK_ENTRIES / n)``, at least ``AUTO_BLOCK_MIN``."""
    if symmetric_tiles(dtype):
        return None if n <= AUTO_BLOCK_THRESHOLD else AUTO_BLOCK_SIZE
    if n <= AUTO_BLOCK_THRESHOLD_FLOAT32:
        return None
    rows = max(AUTO_BLOCK_MIN, min(AUTO_BLOCK_ROWS_FLOAT32, AUTO_BLOCK_ENTRIES // n))
    return 1 << (rows.bit_length() - 1)


def resolve_block_size(config: Config) -> int | None:
    n, block = config.model.n, config.solver.block_size
    if block is None:
        return auto_block_size(n, jnp.float32 if config.solver.dtype == "float32" else jnp.float64)
    return block if block < n else None


# Copies of each array a run holds at once, counted by memory_estimate (upper bounds, not tuned):
# the state and the integrator's stages; the logits, kernel and weights of a pair block; the
# gauge the simulation uses (RoPE: its angles n x m; other gauges: their matrices n x d x d); the
# dense matrices n x d x d made at the edges of a gauged run: for the metrics of the final snapshot
# (analysis/summary.py calls `gauge.matrices()`), and, except for RoPE, whose store keeps its angles,
# for the store (workflows/run.py); the snapshots (kept by solve, read back for the metrics, and
# their gauge-frame view for the figures).
_STATE_COPIES, _PAIR_COPIES, _GAUGE_COPIES, _EDGE_GAUGE_COPIES, _SNAPSHOT_COPIES = 16, 4, 1, 2, 3
_EDGE_ROPE_COPIES = 1  # the metrics' matrices only (the store keeps RoPE's angles)
_FEATURE_COPIES = 2  # the expansion's features of a stage (the moments are rank x d)


def physical_memory() -> int:
    """Bytes of memory of this machine (the bound of ``memory_estimate``)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # not reported: no bound
        return 2**62


def memory_estimate(config: Config, *, streamed: bool = False) -> dict[str, int]:
    """An upper estimate of the bytes a run of ``config`` holds at once, by the key that drives
    each term: ``model.n`` (states and pair blocks: ``n × n`` dense, ``n × block`` blocked),
    ``model.d`` (the gauge: RoPE's angles ``n × m`` or other gauges' matrices ``n × d × d``
    for the simulation, and the dense matrices of the store and metrics), ``aux.n_prompts``
    (prompt rotations), ``factor.path`` (an ``n × n`` factor) and ``solver.save_every`` (the
    snapshots: all of them, or with ``streamed`` those of one compiled call, as ``attnflow run``
    holds them). With ``solver.interaction = "expansion"`` the pair blocks are replaced by the
    expansion's features, ``n × rank``."""
    model, solver = config.model, config.solver
    n, d = model.n, model.d
    size = 4 if solver.dtype == "float32" else 8
    block = resolve_block_size(config)
    try:
        rank = (
            expansion_rank(
                d,
                dynamics_beta(config),
                solver.tolerance,
                kind=model.profile,
                normalization=model.normalization,
            )
            if solver.interaction == "expansion"
            else None
        )
    except ValueError:  # beyond the expansion's limits: build() reports it in one line
        rank = None
    if rank is not None and rank <= MAX_RANK:  # above it, build() refuses the expansion in one line
        pairs = _FEATURE_COPIES * n * rank * size
    else:
        pairs = _PAIR_COPIES * n * (n if block is None else block) * size
    terms = {"model.n": _STATE_COPIES * n * d * size + pairs}
    if config.gauge.kind != "none":
        terms["model.d"] = _gauge_bytes(config, size)
    if config.gauge.kind == "prompt":
        terms["aux.n_prompts"] = 2 * config.aux.n_prompts * d * d * 8
    if config.factor.kind == "file":
        terms["factor.path"] = 2 * n * n * 8
    held = snapshot_count(solver.t_end, solver.save_every)
    if streamed:  # one compiled call's snapshots, and the first and last kept for the figures
        held = min(held, SNAPSHOT_GROUP_MAX) + 2
    terms["solver.save_every"] = _SNAPSHOT_COPIES * held * n * d * size
    return terms


def _gauge_bytes(config: Config, size: int) -> int:
    """Bytes of a gauged run's gauge: what the simulation holds (RoPE: ``n x m`` angles, ``m``
    its frequencies; other gauges: ``n x d x d`` matrices) and the dense matrices of the edges
    (the metrics', and the store's except for RoPE, which stores its angles)."""
    g, n, d = config.gauge, config.model.n, config.model.d
    dense = n * d * d * size
    if g.kind == "rope":
        if isinstance(g.frequencies, str):
            pairs = d // 2 if g.frequencies == "roformer" else 1
        else:
            pairs = len(g.frequencies)
        return n * pairs * size + _EDGE_ROPE_COPIES * dense
    return _GAUGE_COPIES * dense + _EDGE_GAUGE_COPIES * dense


def check_memory(config: Config, *, limit: int | None = None, streamed: bool = False) -> None:
    """Refuse, in one line naming the key that drives it, a run whose ``memory_estimate`` exceeds
    ``limit`` bytes (default: the machine's memory), before anything is allocated."""
    limit = physical_memory() if limit is None else limit
    terms = memory_estimate(config, streamed=streamed)
    total = sum(terms.values())
    if total <= limit:
        return
    # The key to change: what alone does not fit (one snapshot set aside), else the snapshot count.
    sizes = {k: v for k, v in terms.items() if k != "solver.save_every"}
    key = max(sizes, key=sizes.__getitem__) if sum(sizes.values()) > limit else "solver.save_every"
    raise ConfigError(
        f"config: `{key}` must leave the run within memory: about {total / 2**30:.3g} GiB needed "
        f"(n = {config.model.n}, d = {config.model.d}, {_term_words(terms)}), "
        f"{limit / 2**30:.3g} GiB available; got {_key_value(config, key)!r}."
    )


def _term_words(terms: dict[str, int]) -> str:
    return ", ".join(f"{key}: {value / 2**30:.3g} GiB" for key, value in terms.items())


def _key_value(config: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(config, section), name)


def _profile_scale(profile, largest: float = 1.0) -> float:
    """The field's scale for the step-size warning, on the host: ``c e^{β m}`` (``m`` the largest
    product of a head's query and key norms, 1 without heads), or ``c`` for the linear profile. It is
    inf where ``e^{β m}`` overflows float64 (β m above ~709), without NumPy's overflow warning: the
    step warning says what it means."""
    c = float(np.asarray(profile.c))
    if profile.kind != "exp":
        return c
    with np.errstate(over="ignore"):
        return c * float(np.exp(float(np.asarray(profile.beta)) * largest))


def build(
    config: Config,
    *,
    memory_limit: int | None = None,
    streamed: bool = False,
    layer_norms: bool | None = None,
) -> Simulation:
    """Build every runtime object of a simulation from its config (after ``check_memory``;
    ``streamed``: the caller keeps one compiled call's snapshots at a time, as ``attnflow run``).
    ``layer_norms``: whether the caller runs a ``model.layer_norm`` other than post (its state, and
    the radii of pre and peri, as ``attnflow run`` stores them); default ``streamed``. Other callers
    (the experiments, the landscape: post-LN models) refuse one in one line."""
    if config.density is not None:  # sweep, realize, reproduce, landscape: particles only
        raise ConfigError.from_parts(
            "density",
            "absent here (particles; `attnflow run` solves a config with a [density] section)",
            "a [density] section",
        )
    if config.model.layer_norm != "post" and not (streamed if layer_norms is None else layer_norms):
        raise ConfigError.from_parts(
            "model.layer_norm",
            "'post' here (the experiments and the landscape study the paper's post-LN layer; "
            "`attnflow run` and `attnflow sweep` run the others)",
            config.model.layer_norm,
        )
    check_memory(config, limit=memory_limit, streamed=streamed)
    dtype = jnp.float32 if config.solver.dtype == "float32" else jnp.float64
    model, solver = config.model, config.solver
    xi = make_labels(config)
    profile = make_profile(
        model.profile, beta=dynamics_beta(config), time_scale=model.time_scale, dtype=dtype
    )
    block_size = resolve_block_size(config)
    if config.attention is not None:
        return _build_heads(config, xi, profile, block_size, dtype)
    with library_errors():  # the library's checks, reported under the config keys (io.parameters)
        gauge = make_gauge(config, xi, dtype)
        kernel = Kernel(gauge=gauge, factor=make_factor(config, xi, dtype), profile=profile)
    context = None if solver.interaction == "exact" else f"`solver.interaction` = {solver.interaction!r}"
    with library_errors(context):  # the expansion's limits are those of the interaction chosen
        field = make_vector_field(
            kernel,
            normalization=model.normalization,
            causal=model.causal,
            value=model.value,
            block_size=block_size,
            interaction=solver.interaction,
            tolerance=solver.tolerance,
            sources=model.sources,
        )
    _warn_step(solver, _profile_scale(profile))
    return _simulation(config, kernel, field, xi, block_size, dtype)


def _with_layer_norm(config: Config, field):
    """``field`` under ``model.layer_norm``: post-LN is the field itself (bitwise the paper's model);
    the others wrap it (:class:`~attnflow.numerics.layer_norms.LayerNormField`)."""
    model = config.model
    if model.layer_norm == "post":
        return field
    with library_errors():
        return LayerNormField(field, model.layer_norm, alpha=model.ngpt_alpha)


def _on_the_devices(field):
    """``field`` with its tokens sharded over every device where the placement asks it (an
    accelerator with more than one: :attr:`Placement.shards_tokens`), else ``field`` itself."""
    if not placement.current().shards_tokens:
        return field
    from attnflow.numerics.sharding import shard_tokens

    return shard_tokens(field)


def _simulation(config: Config, kernel: Kernel, field, xi: np.ndarray, block_size, dtype) -> Simulation:
    """The simulation of ``field`` under the config's layer norm; the initial data are centred in
    ``kernel``'s gauge frame. The integrator's retraction is the state's (``"none"`` for pre and peri)."""
    solver = config.solver
    field = _with_layer_norm(config, _on_the_devices(field))
    integrator = make_integrator(solver.method, rtol=solver.rtol, atol=solver.atol)
    if isinstance(field, LayerNormField) and field.retraction != integrator.retraction:
        integrator = dataclasses.replace(integrator, retraction=field.retraction)
    return Simulation(
        kernel=kernel,
        field=field,
        x0=make_initial(config, kernel.gauge, dtype),
        xi=xi,
        groups=xi.astype(int) if config.aux.kind == "prompts" else None,
        integrator=integrator,
        dt=solver.dt,
        t_end=solver.t_end,
        save_every=solver.save_every,
        noise=config.model.noise,
        key=noise_key(np.int64(config.init.seed)),
        block_size=block_size,
        interaction=field.interaction,
        rank=field.rank,
        max_steps=solver.max_steps,
        layer_norm=config.model.layer_norm,
        attention_factor=None if config.gauge.preset is None else rope_attention_factor(config),
    )


def _warn_step(solver, scale: float) -> None:
    ratio = solver.dt * scale
    if solver.method == "adaptive" or not ratio > 1.0:
        return
    if math.isinf(scale):  # no dt is small enough: the scale itself is not a float64 number
        advice = "c·e^β itself overflows float64, so no step is stable: lower model.beta"
    else:
        advice = f"consider dt <= {1.0 / scale:.3g}"
    # the ratio with as many digits as it takes to show it above 1 (1.0043, not "1 > 1")
    shown = next(text for text in (f"{ratio:.{digits}g}" for digits in (3, 5, 17)) if float(text) > 1.0)
    warnings.warn(
        f"solver.dt = {solver.dt} is outside the stable range: dt·c·e^β = {shown} > 1 "
        f"(collapse rate ≈ 2c·e^β); {advice}.",
        stacklevel=3,
    )


def _build_heads(config: Config, xi: np.ndarray, profile, block_size, dtype) -> Simulation:
    """A simulation of the heads of ``config.attention`` (:class:`HeadsField`). The simulation's
    ``kernel`` is the identity gauge and factor in dimension ``d`` (the content and its views);
    the heads' gauges and factors live in the field. "auto" runs the exact sums."""
    model, solver = config.model, config.solver
    n, d = model.n, model.d
    with library_errors():
        heads = make_heads(config, xi, dtype, make_gauge=make_gauge, make_factor=make_factor)
    interaction = "exact" if solver.interaction == "auto" else solver.interaction
    with library_errors("`solver.interaction`" if interaction == "expansion" else "`attention`"):
        field = HeadsField(
            heads,
            profile,
            normalization=model.normalization,
            causal=model.causal,
            sources=model.sources,
            block_size=block_size,
            interaction=interaction,
            tolerance=solver.tolerance,
        )
    largest = max(np.prod(head_norms(head)) for head in heads)
    _warn_step(solver, _profile_scale(profile, float(largest)))
    kernel = Kernel(gauge=gauges.IdentityGauge(n=n, d=d), factor=factors.NoFactor(n=n), profile=profile)
    return _simulation(config, kernel, field, xi, block_size, dtype)
