"""The configuration's schema: seven frozen sections and two optional ones (``attention``, and
``density``, which makes ``attnflow run`` solve the mean-field density), each field with its type,
range and default.

A configuration is plain, frozen data: seven sections (``model``, ``aux``, ``gauge``, ``factor``,
``init``, ``solver``, ``storage``), each a pydantic model whose defaults are the library's defaults.
Constraints on one value (type, range, allowed choices) live on the field; rules that tie several
values together are in :mod:`attnflow.io.config_rules`, run by the :class:`Config` validator once
every field is valid.

Types are strict, field by field: an integer field takes an integer (not ``"64"``, not ``64.0``),
a boolean ``true``/``false`` (not ``"yes"``, not 1), a string a string; a number field takes an
integer too (TOML's ``beta = 1``). Lists are TOML arrays (read as tuples), with strict entries.
"""

from typing import Annotated, ClassVar, Literal, Self

import numpy as np
from annotated_types import Ge, Gt, Le, Lt, MinLen
from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_serializer, model_validator

from attnflow.core.rope_presets import PRESETS, RULES, Scaling
from attnflow.io.config_rules import MAX_STEPS, SCALING_KEYS, check_rules

__all__ = [
    "AttentionConfig",
    "AuxConfig",
    "Config",
    "DensityConfig",
    "FactorConfig",
    "GaugeConfig",
    "InitConfig",
    "ModelConfig",
    "SECTIONS",
    "SolverConfig",
    "StorageConfig",
]

SKEW_ATOL = 1e-12  # entrywise tolerance on |G + G^T| for generalized_rope generators

# Strict scalars: no coercion from strings ("64", "yes") or between bool and numbers; a strict
# float still takes an int (TOML writes beta = 1).
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]
PositiveFloat = Annotated[Float, Gt(0)]
NonNegativeFloat = Annotated[Float, Ge(0)]
SEED_MAX = 2**63 - 1  # seeds are signed 64-bit integers (JAX and NumPy keys)
Seed = Annotated[Int, Ge(0), Le(SEED_MAX), Field(description="an integer in [0, 2**63 - 1]")]
FloatList = Annotated[tuple[Float, ...], MinLen(1)]
Matrix = tuple[tuple[Float, ...], ...]
FilePath = Annotated[Str | None, Field(description="a file path (a non-empty string)", min_length=1)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    # keys added after runs existed: left out of the resolved config at their default, so that
    # resolved configs (and their hashes, the names of run folders) are what they were before
    absent_at_default: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _without_new_keys_at_default(self, handler):
        data = handler(self)
        for name in self.absent_at_default:
            if getattr(self, name) == type(self).model_fields[name].default:
                data.pop(name, None)
        return data


class ModelConfig(_Frozen):
    """The kernel profile and the dynamics: profile, β, time scale, normalisation, values, noise."""

    n: Int = Field(64, ge=2)
    d: Int = Field(3, ge=2)
    beta: PositiveFloat = 1.0
    beta_scaling: Literal["none", "log_n"] = Field(
        "none", description="'none' (beta as given) or 'log_n' (beta = gamma log n, the long-context regime)"
    )
    gamma: PositiveFloat = Field(1.0, description="beta = gamma log n with beta_scaling = 'log_n'")
    time_scale: Literal["plain", "rescaled"] = "plain"
    profile: Literal["exp", "linear"] = "exp"
    normalization: Literal["usa", "sa"] = "usa"
    causal: Bool | Literal["strict"] = Field(
        False, description="false, true (token i sees the tokens j <= i by position) or 'strict' (j < i)"
    )
    value: Literal["gradient", "logits_only"] = "gradient"
    noise: NonNegativeFloat = 0.0
    sources: Annotated[Int, Ge(0)] = Field(
        0, description="the first `sources` tokens by position are attended to and never move"
    )
    layer_norm: Literal["post", "pre", "peri", "ngpt"] = Field(
        "post",
        description="where the layer's normalisation acts: 'post' (the paper's: dx/dt = P_x A, tokens on "
        "the sphere), 'pre' (tokens z = r x in R^d, dz/dt = A), 'peri' (dz/dt = A/|A|) or 'ngpt' "
        "(dx/dt = ngpt_alpha P_x(A/|A|)); pre and peri store each token's radius r beside x",
    )
    ngpt_alpha: PositiveFloat = Field(1.0, description="nGPT's step scale alpha (model.layer_norm = 'ngpt')")
    # keys added after runs existed (the paper's model leaves them out of its resolved config)
    absent_at_default = ("layer_norm", "ngpt_alpha")


class AuxConfig(_Frozen):
    """The frozen auxiliary labels xi (positions, prompt ids, or from a file)."""

    kind: Literal["none", "positions", "prompts", "file"] = "none"
    spacing: Literal["index", "unit", "midpoint"] | PositiveFloat = "index"
    n_prompts: Int = Field(4, ge=1)
    assignment: Literal["cyclic", "random"] = "cyclic"
    seed: Seed = 0
    path: FilePath = None


class GaugeConfig(_Frozen):
    """The gauge Q(xi) in O(d): one orthogonal matrix per token."""

    kind: Literal["none", "rope", "generalized_rope", "prompt", "file"] = "none"
    frequencies: Literal["roformer", "full_period"] | FloatList = "full_period"
    base: PositiveFloat = 10000.0
    axes: Annotated[tuple[Literal["x", "y", "z"], ...], MinLen(1)] = ("z", "x")
    generators: Annotated[tuple[Matrix, ...], MinLen(1)] | None = Field(
        None, description="a list of square skew-symmetric matrices (each a list of rows)"
    )
    rates: FloatList = (1.0, 3.0)
    omega: Literal["full_period"] | Float = "full_period"
    seed: Seed = 100
    path: FilePath = None
    preset: Literal[tuple(PRESETS)] | None = None  # type: ignore[valid-type]  (the published models' RoPE)
    scaling: Literal[("preset", "none", *RULES)] = Field(  # type: ignore[valid-type]
        "preset",
        description="with `gauge.preset`: 'preset' (the model's own long-context rule, as published), "
        "'none' (no rule), or a rule applied to the model's frequencies instead: 'linear', 'ntk', "
        "'yarn' (which also multiplies beta by (0.1 ln s + 1)^2) or 'llama3'",
    )
    scaling_factor: Annotated[Float, Ge(1)] | None = Field(
        None, description="the rule's factor s >= 1 (the context grows s-fold); required with a rule"
    )
    original_context: Annotated[Int, Ge(1)] | None = Field(
        None,
        description="'yarn' and 'llama3': the original context L the rule is measured against; "
        "unset: the preset's context (its max_position_embeddings)",
    )
    low_freq_factor: PositiveFloat = Field(
        Scaling.low_freq_factor, description="'llama3': wavelengths above L / low_freq_factor divided by s"
    )
    high_freq_factor: PositiveFloat = Field(
        Scaling.high_freq_factor,
        description="'llama3': wavelengths below L / high_freq_factor kept (> low_freq_factor)",
    )
    beta_fast: PositiveFloat = Field(
        Scaling.beta_fast,
        description="'yarn': pairs turning more than beta_fast times over L are kept (YaRN's beta, not "
        "the inverse temperature)",
    )
    beta_slow: PositiveFloat = Field(
        Scaling.beta_slow,
        description="'yarn': pairs turning fewer than beta_slow times over L are divided by s "
        "(YaRN's alpha; < beta_fast)",
    )
    absent_at_default = (
        "preset", "scaling", "scaling_factor", "original_context", "low_freq_factor", "high_freq_factor",
        "beta_fast", "beta_slow",
    )  # fmt: skip

    @model_serializer(mode="wrap")
    def _without_new_keys_at_default(self, handler):
        """As every section, except that a rule named in ``scaling`` writes the keys it reads, at their
        defaults too (the resolved config says which ramp ran; no config before the rules had one)."""
        data = handler(self)
        read = {name for name, rules in SCALING_KEYS if self.scaling in rules}
        for name in self.absent_at_default:
            if name not in read and getattr(self, name) == type(self).model_fields[name].default:
                data.pop(name, None)
        return data

    @field_validator("generators")
    @classmethod
    def _square_and_skew(cls, generators: tuple[Matrix, ...] | None) -> tuple[Matrix, ...] | None:
        if generators is None:
            return None
        size = len(generators[0])
        if any(len(g) != size or any(len(row) != size for row in g) for g in generators):
            raise ValueError("a list of square matrices, all of one size d x d")
        for k, g in enumerate(generators):
            asymmetry = float(np.max(np.abs(np.asarray(g) + np.asarray(g).T)))
            if asymmetry > SKEW_ATOL:
                raise ValueError(
                    f"skew-symmetric matrices, |G + G^T| <= {SKEW_ATOL:g} entrywise "
                    f"(generator {k} is off by {asymmetry:.3g})"
                )
        return generators


class FactorConfig(_Frozen):
    """The factor w(xi, zeta): a symmetric weight of the labels multiplying the kernel."""

    kind: Literal["none", "distance_bias", "toeplitz_cos", "file"] = "none"
    slope: NonNegativeFloat = 1.0
    omega: Float = 2 * np.pi
    path: FilePath = None


class AttentionConfig(_Frozen):
    """Attention heads with query, key, value and output maps (absent: the paper's single head
    with identity maps)."""

    heads: Int = Field(1, ge=1, le=1024, description="the number of heads H, their outputs added")
    head_dim: Int | None = Field(None, ge=1, le=65536, description="d_h; null: model.d")
    values: Literal["plain", "rotated"] = Field(
        "rotated", description="'plain' (a RoPE layer: out = W_O sum a W_V x) or 'rotated' (the paper's)"
    )
    weights: Str = Field(
        "identity",
        min_length=1,
        description="'identity', 'gaussian', 'orthogonal', 'shared' (W_Q = W_K = W_V = W, W_O = W^T), "
        "'random_qk' (random W_Q, W_K; W_V = W_O = I; all seeded), or a .npz file holding query, "
        "key, value (H, d_h, d) and output (H, d, d_h)",
    )
    scale: PositiveFloat = Field(1.0, description="the random maps' scale (|W x| about scale)")
    seed: Seed = 0
    alibi: Bool = Field(
        False, description="per-head distance-bias slopes 2^(-8h/H) (factor.kind = 'distance_bias')"
    )


class InitConfig(_Frozen):
    """Initial data on the sphere."""

    kind: Literal["uniform", "cap", "equiangular", "file"] = "uniform"
    seed: Seed = 0
    center: FloatList = (0.0, 0.0, 1.0)
    sigma: PositiveFloat = 0.2
    rho0: Float = 0.1
    path: FilePath = None

    @field_validator("center")
    @classmethod
    def _nonzero(cls, center: tuple[float, ...]) -> tuple[float, ...]:
        if not any(center):
            raise ValueError("a nonzero list of numbers (a direction)")
        return center


class SolverConfig(_Frozen):
    """The integrator and the time grid. ``block_size = None`` chooses automatically."""

    method: Literal["euler", "rk4", "geodesic_rk4", "adaptive"] = "rk4"
    dt: PositiveFloat = 0.01
    t_end: PositiveFloat = 20.0
    save_every: PositiveFloat = 0.1
    rtol: PositiveFloat = 1e-8
    atol: PositiveFloat = 1e-10
    dtype: Literal["float64", "float32"] = "float64"
    block_size: Annotated[Int, Ge(1)] | None = None
    interaction: Literal["auto", "exact", "expansion"] = Field(
        "exact",
        description="how the attention sums are computed: 'exact' (all n^2 pairs), 'expansion' "
        "(O(n) by a polynomial of the logit, within `tolerance`; factors none, distance_bias, "
        "toeplitz_cos), or 'auto' (the expansion where its cost model says it is cheaper)",
    )
    tolerance: Float = Field(
        1e-10,
        gt=0,
        lt=1,
        description="the expansion's error bound, relative to the field's scale (interaction "
        "'expansion' or 'auto' only)",
    )
    max_steps: Annotated[Int, Ge(1), Le(MAX_STEPS)] | None = Field(
        None,
        description=f"an integer in [1, {MAX_STEPS:.0e}] or left out: the adaptive solver's bound on its "
        "steps over the whole run (the run then stops with status 'max_steps'); left out: at most "
        "10^6 trial steps per snapshot",
    )
    absent_at_default = ("max_steps",)


class StorageConfig(_Frozen):
    """What a run folder keeps of the snapshots (``trajectory.zarr``); the metrics are computed from
    every token of every snapshot whatever is stored. The defaults store everything."""

    token_stride: Annotated[Int, Ge(1)] = Field(
        1, description="store tokens 0, k, 2k, ... of each snapshot (with their labels and gauges)"
    )
    dtype: Literal["float64", "float32"] | None = Field(
        None, description="the stored snapshots' precision; null: the solver's dtype"
    )
    snapshots: Literal["all", "final"] = Field(
        "all", description="'all' saved times, or 'final': the initial and the last snapshot only"
    )


class DensityConfig(_Frozen):
    """The mean-field density instead of particles: with this section ``attnflow run`` solves the
    continuity equation of the tokens' law on a uniform angle grid of S^1 (`grid`, model.d = 2) or in
    spherical harmonics on S^2 (`lmax`, model.d = 3), with the labels on quadrature nodes (positions
    on [0, 1), prompt ids, or a file of nodes), from a uniform law plus one wave, a von Mises-Fisher
    mixture, or grid values read from a file."""

    grid: Annotated[Int, Ge(8)] | None = Field(
        None, description="S^1 (model.d = 2): the number M of angles theta_k = 2 pi k / M"
    )
    lmax: Annotated[Int, Ge(2)] | None = Field(
        None, description="S^2 (model.d = 3): the largest spherical-harmonic degree"
    )
    labels: Int = Field(
        16, ge=1, description="number of label nodes on [0, 1) (aux.kind = 'positions'; weights of the rule)"
    )
    label_rule: Literal["midpoint", "gauss"] = Field(
        "midpoint",
        description="the positions' quadrature: 'midpoint' ((l + 1/2)/labels, for periodic kernels) or "
        "'gauss' (Gauss-Legendre on [0, 1], for a distance bias)",
    )
    init: Literal["uniform", "vmf", "file"] = Field(
        "uniform",
        description="the initial law: 'uniform' (plus `amplitude` times a wave of `mode`), 'vmf' (a von "
        "Mises-Fisher mixture) or 'file' (grid values in `path`; implied when `path` is set, as "
        "'vmf' is when `centers` is)",
    )
    amplitude: Annotated[Float, Ge(0), Lt(1)] = Field(
        0.0,
        description="the wave's amplitude: f0 = (1 + amplitude cos(mode (theta - phase))) / 2 pi per "
        "label (S^2: a Legendre polynomial P_mode of the cosine to a direction), phases from `seed`",
    )
    mode: Int = Field(1, ge=1, description="the wave's Fourier mode (S^1) or degree (S^2)")
    seed: Seed = 0
    centers: Annotated[tuple[FloatList, ...], MinLen(1)] | None = Field(
        None, description="the mixture's mean directions, each a list of model.d numbers"
    )
    kappa: PositiveFloat = Field(10.0, description="the mixture's concentration (one for every component)")
    weights: FloatList | None = Field(
        None, description="the mixture's weights, one per center (positive; left out: equal)"
    )
    path: FilePath = None

    @model_validator(mode="before")
    @classmethod
    def _implied_init(cls, data):
        """``path`` written without ``init`` means ``init = "file"``; ``centers`` means ``"vmf"``."""
        if isinstance(data, dict) and "init" not in data:
            if data.get("path") is not None:
                return {**data, "init": "file"}
            if data.get("centers") is not None:
                return {**data, "init": "vmf"}
        return data

    @field_validator("centers")
    @classmethod
    def _nonzero_centers(cls, centers: tuple[tuple[float, ...], ...] | None):
        if centers is not None and any(not any(center) for center in centers):
            raise ValueError("a list of nonzero directions (lists of numbers)")
        return centers

    @field_validator("weights")
    @classmethod
    def _positive_weights(cls, weights: tuple[float, ...] | None):
        if weights is not None and any(w <= 0 for w in weights):
            raise ValueError("a list of positive numbers")
        return weights


class Config(_Frozen):
    """A whole run configuration: the seven sections plus cross-section rules."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    aux: AuxConfig = Field(default_factory=AuxConfig)
    gauge: GaugeConfig = Field(default_factory=GaugeConfig)
    factor: FactorConfig = Field(default_factory=FactorConfig)
    init: InitConfig = Field(default_factory=InitConfig)
    solver: SolverConfig = Field(default_factory=SolverConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    attention: AttentionConfig | None = None
    density: DensityConfig | None = None

    @model_validator(mode="after")
    def _check_rules(self) -> Self:
        check_rules(self)
        return self

    @model_serializer(mode="wrap")
    def _without_absent_attention(self, handler):
        """No ``attention`` or ``density`` key for the paper's model: its resolved config is what it
        always was."""
        data = handler(self)
        for name in ("attention", "density"):
            if getattr(self, name) is None:
                data.pop(name, None)
        return data


def _section_model(annotation) -> type[BaseModel]:
    """The section's model (``AttentionConfig`` for the optional ``AttentionConfig | None``)."""
    return next(a for a in getattr(annotation, "__args__", (annotation,)) if a is not type(None))


SECTIONS: dict[str, type[BaseModel]] = {
    name: _section_model(field.annotation) for name, field in Config.model_fields.items()
}
