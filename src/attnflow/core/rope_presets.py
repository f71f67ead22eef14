"""The rotary position embeddings of published models, as RoPE gauges of one attention head.

A preset is what a model's published configuration (its ``config.json``) says about RoPE: the base
``θ`` (``rope_theta``), the head dimension ``d_h`` (``hidden_size / num_attention_heads``, or
``head_dim``), the rotary fraction (GPT-NeoX's ``rotary_pct``, GPT-J's ``rotary_dim / d_h``), the
pair layout of its code (``"half"``: ``rotate_half``, pairs ``(k, k + r/2)``; ``"interleaved"``:
GPT-J's ``rotate_every_two``, pairs ``(2k, 2k+1)``) and its scaling rule (``rope_scaling``).

The frequencies of ``r = int(d_h · fraction)`` rotary coordinates are ``ω_k = θ^{−2k/r}``,
``k = 0 … r/2 − 1``, then rescaled by the rule (``scaled_frequencies``):

- ``linear`` (position interpolation): ``ω_k / s``.
- ``ntk`` (NTK-aware): the base becomes ``θ · s^{r/(r−2)}``.
- ``yarn``: ``ω_k (1 − γ_k) / s + ω_k γ_k`` with the ramp ``γ_k`` that is 1 for the pairs that
  turn more than ``β_fast`` times over the original context ``L`` and 0 below ``β_slow`` turns
  (linear in ``k`` between the two), and an attention factor ``0.1 ln s + 1`` on both ``q`` and
  ``k`` (so ``β`` times its square in the logits: ``attention_factor``).
- ``llama3``: wavelengths ``λ_k = 2π/ω_k`` below ``L/h`` (``h = high_freq_factor``) kept, above
  ``L/l`` (``l = low_freq_factor``) divided by ``s``; in between ``(1 − a) ω_k / s + a ω_k`` with
  ``a = (L/λ_k − l) / (h − l)``.

These are the formulas of the models' reference code (the Hugging Face ``transformers``
implementation of each rule, ``modeling_rope_utils``), written here from their definitions;
``tests/test_rope_presets.py`` checks each against a scalar transcription of the same rule and the
presets' numbers against the published configurations named in ``source``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

RULES = ("linear", "ntk", "yarn", "llama3")
LAYOUTS = ("half", "interleaved")


@dataclasses.dataclass(frozen=True)
class Scaling:
    """A context-extension rule: ``rule`` in ``RULES``, factor ``s``, the original context ``L``."""

    rule: str
    factor: float
    original_context: int
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"rope preset: `scaling` must be one of {RULES}; got {self.rule!r}.")
        if not self.factor >= 1.0:
            raise ValueError(f"rope preset: the scaling `factor` must be >= 1; got {self.factor!r}.")
        for upper, lower in (("high_freq_factor", "low_freq_factor"), ("beta_fast", "beta_slow")):
            if not getattr(self, upper) > getattr(self, lower) > 0:
                raise ValueError(
                    f"rope preset: `{upper}` must be greater than `{lower}` = {getattr(self, lower)!r} "
                    f"(both > 0); got {getattr(self, upper)!r}."
                )


@dataclasses.dataclass(frozen=True)
class RopePreset:
    """The RoPE of one published model (``source``: where its numbers are published)."""

    base: float
    head_dim: int
    context: int  # max_position_embeddings
    source: str
    rotary_fraction: float = 1.0
    layout: str = "half"
    scaling: Scaling | None = None

    @property
    def rotary_dim(self) -> int:
        """``r``: the coordinates that rotate (even), the first ``r`` of the head."""
        return int(self.head_dim * self.rotary_fraction) // 2 * 2


_HF = "config.json of huggingface.co/"
PRESETS: dict[str, RopePreset] = {
    "llama2": RopePreset(10000.0, 128, 4096, _HF + "meta-llama/Llama-2-7b-hf"),
    "llama3": RopePreset(500000.0, 128, 8192, _HF + "meta-llama/Meta-Llama-3-8B"),
    "llama3.1": RopePreset(
        500000.0, 128, 131072, _HF + "meta-llama/Llama-3.1-8B",
        scaling=Scaling("llama3", 8.0, 8192, low_freq_factor=1.0, high_freq_factor=4.0),
    ),  # fmt: skip
    "qwen2": RopePreset(1000000.0, 128, 32768, _HF + "Qwen/Qwen2-7B"),
    "mistral": RopePreset(10000.0, 128, 32768, _HF + "mistralai/Mistral-7B-v0.1"),
    "gpt-neox": RopePreset(10000.0, 96, 2048, _HF + "EleutherAI/gpt-neox-20b", rotary_fraction=0.25),
    "gpt-j": RopePreset(
        10000.0, 256, 2048, _HF + "EleutherAI/gpt-j-6b", rotary_fraction=0.25, layout="interleaved"
    ),
    "gemma": RopePreset(10000.0, 256, 8192, _HF + "google/gemma-7b"),
}


def get_preset(name: str) -> RopePreset:
    """The preset ``name`` (a key of ``PRESETS``), with the closest names in the message if unknown."""
    if name not in PRESETS:
        import difflib

        close = difflib.get_close_matches(name, PRESETS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"rope preset: `preset` must be one of {tuple(PRESETS)}; got {name!r}.{hint}")
    return PRESETS[name]


def base_frequencies(preset: RopePreset) -> np.ndarray:
    """``ω_k = θ^{−2k/r}``, ``k = 0 … r/2 − 1`` (float64)."""
    r = preset.rotary_dim
    return preset.base ** (-np.arange(0, r, 2, dtype=np.float64) / r)


def scaled_frequencies(preset: RopePreset, scaling: Scaling | None = None) -> np.ndarray:
    """The frequencies after the scaling rule (``scaling``: the preset's own when None; pass
    ``Scaling`` to apply another rule to the same model)."""
    scaling = preset.scaling if scaling is None else scaling
    omega = base_frequencies(preset)
    if scaling is None:
        return omega
    s, length, r = scaling.factor, scaling.original_context, preset.rotary_dim
    if scaling.rule == "linear":
        return omega / s
    if scaling.rule == "ntk":
        base = preset.base * s ** (r / (r - 2))
        return base ** (-np.arange(0, r, 2, dtype=np.float64) / r)
    if scaling.rule == "yarn":
        def pair_at(turns: float) -> float:  # the (fractional) pair index that turns `turns` times
            return r * math.log(length / (turns * 2 * math.pi)) / (2 * math.log(preset.base))

        low = max(math.floor(pair_at(scaling.beta_fast)), 0)
        high = min(math.ceil(pair_at(scaling.beta_slow)), r - 1)
        high = high + 0.001 if high == low else high
        ramp = np.clip((np.arange(r // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
        keep = 1.0 - ramp  # 1: extrapolate (the fast pairs), 0: interpolate
        return omega / s * (1.0 - keep) + omega * keep
    wavelength = 2 * math.pi / omega  # llama3
    low_l, high_h = scaling.low_freq_factor, scaling.high_freq_factor
    divided = np.where(wavelength > length / low_l, omega / s, omega)
    a = (length / wavelength - low_l) / (high_h - low_l)
    smooth = (1.0 - a) * divided / s + a * divided
    medium = (wavelength >= length / high_h) & (wavelength <= length / low_l)
    return np.where(medium, smooth, divided)


def attention_factor(preset: RopePreset, scaling: Scaling | None = None) -> float:
    """The factor on ``q`` and ``k`` that the rule adds (YaRN: ``0.1 ln s + 1``; else 1): the
    logits, so ``β``, scale by its square."""
    scaling = preset.scaling if scaling is None else scaling
    if scaling is None or scaling.rule != "yarn":
        return 1.0
    return 0.1 * math.log(scaling.factor) + 1.0


def check_head_dim(preset: RopePreset, head_dim: int, *, name: str, where: str) -> None:
    """A preset sets the head dimension: ``head_dim`` (the gauge's dimension) must equal it."""
    if head_dim != preset.head_dim:
        raise ValueError(
            f"{where}: `{name}` must be the preset's head dimension {preset.head_dim}; got {head_dim}."
        )
