"""RoPE presets of published models (core.rope_presets): each preset's numbers as its model's
published config.json has them, each scaling rule against a scalar transcription of its
definition, the pair layouts conjugate by a permutation, and the errors."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.core import gauges, rope_presets
from attnflow.core.rope_presets import PRESETS, Scaling, attention_factor, get_preset, scaled_frequencies
from helpers_core import uniform

# (rope_theta, hidden_size / num_attention_heads or head_dim, rotary part, max_position_embeddings)
# as published in each model's config.json (the preset's ``source``)
PUBLISHED = {
    "llama2": (10000.0, 4096 // 32, 128, 4096),
    "llama3": (500000.0, 4096 // 32, 128, 8192),
    "llama3.1": (500000.0, 4096 // 32, 128, 131072),
    "qwen2": (1000000.0, 3584 // 28, 128, 32768),
    "mistral": (10000.0, 4096 // 32, 128, 32768),
    "gpt-neox": (10000.0, 6144 // 64, int(0.25 * 96), 2048),  # rotary_pct 0.25
    "gpt-j": (10000.0, 4096 // 16, 64, 2048),  # rotary_dim 64
    "gemma": (10000.0, 256, 256, 8192),  # head_dim 256
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_is_its_published_configuration(name):
    preset = get_preset(name)
    theta, head_dim, rotary, context = PUBLISHED[name]
    numbers = (preset.base, preset.head_dim, preset.rotary_dim, preset.context)
    assert numbers == (theta, head_dim, rotary, context)
    omega = rope_presets.base_frequencies(preset)
    expected = [theta ** (-(2 * k) / rotary) for k in range(rotary // 2)]  # inv_freq = 1 / θ^(2k/r)
    np.testing.assert_allclose(omega, expected, rtol=1e-15)
    assert preset.layout == ("interleaved" if name == "gpt-j" else "half")


def _llama3_scalar(omega, s, length, low, high):
    out = []
    for w in omega:
        wavelength = 2 * math.pi / w
        if wavelength < length / high:
            out.append(w)
        elif wavelength > length / low:
            out.append(w / s)
        else:
            a = (length / wavelength - low) / (high - low)
            out.append((1 - a) * w / s + a * w)
    return out


def _yarn_scalar(theta, r, s, length, fast, slow):
    def pair_at(turns):
        return r * math.log(length / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = max(math.floor(pair_at(fast)), 0), min(math.ceil(pair_at(slow)), r - 1)
    out = []
    for k in range(r // 2):
        w = theta ** (-2 * k / r)
        ramp = min(max((k - low) / (high - low), 0.0), 1.0)
        out.append(w / s * ramp + w * (1 - ramp))
    return out


def test_llama31_frequencies_follow_the_llama3_rule():
    preset = get_preset("llama3.1")
    omega = rope_presets.base_frequencies(preset)
    got = scaled_frequencies(preset)
    np.testing.assert_allclose(got, _llama3_scalar(omega, 8.0, 8192, 1.0, 4.0), rtol=1e-15)
    # the fast pairs are kept, the slow ones divided by 8, and some pairs lie in between
    assert got[0] == omega[0] and got[-1] == omega[-1] / 8
    assert np.any((got < omega) & (got > omega / 8))


@pytest.mark.parametrize("rule", ["linear", "ntk", "yarn"])
def test_the_other_rules_on_llama2(rule):
    preset = get_preset("llama2")
    scaling = Scaling(rule, 4.0, 4096)
    got = scaled_frequencies(preset, scaling)
    theta, r = 10000.0, 128
    if rule == "linear":
        expected = [theta ** (-2 * k / r) / 4 for k in range(r // 2)]
    elif rule == "ntk":
        expected = [(theta * 4 ** (r / (r - 2))) ** (-2 * k / r) for k in range(r // 2)]
    else:
        expected = _yarn_scalar(theta, r, 4.0, 4096, 32.0, 1.0)
    np.testing.assert_allclose(got, expected, rtol=1e-14)
    assert attention_factor(preset, scaling) == (0.1 * math.log(4.0) + 1.0 if rule == "yarn" else 1.0)


def test_the_half_layout_is_the_interleaved_one_conjugated_by_a_permutation():
    n, d, m = 12, 10, 4
    xi = np.arange(n, dtype=float)
    partial = rope_presets.RopePreset(10000.0, d, 64, "test", rotary_fraction=0.8)
    freqs = rope_presets.base_frequencies(partial)
    assert freqs.size == m
    half = gauges.make_rope(xi, d, freqs, layout="half")
    inter = gauges.make_rope(xi, d, freqs)
    # coordinate k of the half layout is coordinate 2k of the interleaved one, k + m is 2k + 1
    perm = np.array([2 * k for k in range(m)] + [2 * k + 1 for k in range(m)] + list(range(2 * m, d)))
    x = uniform(n, d, seed=2)
    conjugated = np.asarray(inter.apply(x[:, np.argsort(perm)]))[:, perm]
    np.testing.assert_array_equal(np.asarray(half.apply(x)), conjugated)
    np.testing.assert_allclose(np.asarray(half.apply_transpose(half.apply(x))), x, atol=1e-15)
    message = r"^rope: `layout` must be one of \('interleaved', 'half'\); got 'zigzag'\.$"
    with pytest.raises(ValueError, match=message):
        gauges.RoPE(angles=jnp.zeros((n, m)), d=d, layout="zigzag")


def test_unknown_presets_and_head_dimensions_are_one_clear_error():
    unknown = r"^rope preset: `preset` must be one of .*; got 'llama-3'\. Did you mean 'llama3'\?$"
    with pytest.raises(ValueError, match=unknown):
        get_preset("llama-3")
    mismatch = r"^attention: `head_dim` must be the preset's head dimension 128; got 64\.$"
    with pytest.raises(ValueError, match=mismatch):
        rope_presets.check_head_dim(get_preset("llama3"), 64, name="head_dim", where="attention")
    with pytest.raises(ValueError, match=r"^rope preset: `scaling` must be one of"):
        Scaling("dynamic", 2.0, 4096)


# --- in a config file --------------------------------------------------------------------------


def _preset_config(**gauge):
    from attnflow.io.config import config_from_dict

    return config_from_dict(
        {"model": {"n": 16, "d": 128}, "aux": {"kind": "positions"}, "gauge": {"kind": "rope", **gauge}}
    )


@pytest.mark.parametrize("scaling", ["preset", "none"])
def test_a_config_preset_builds_the_model_s_rope(scaling):
    from attnflow.workflows.build import make_gauge, make_labels

    config = _preset_config(preset="llama3.1", scaling=scaling)
    gauge = make_gauge(config, make_labels(config), jnp.float64)
    preset = get_preset("llama3.1")
    omega = scaled_frequencies(preset) if scaling == "preset" else rope_presets.base_frequencies(preset)
    assert gauge.layout == "half"
    np.testing.assert_array_equal(np.asarray(gauge.angles), np.outer(np.arange(16.0), omega))


MODEL = {"model": {"n": 16, "d": 128}, "aux": {"kind": "positions"}}
LLAMA3 = {"kind": "rope", "preset": "llama3"}


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        ({"model": {"n": 16, "d": 64}, "gauge": LLAMA3},
         r"`model\.d` must be 128, the head dimension of `gauge\.preset` = 'llama3'; got 64\."),
        ({"gauge": LLAMA3 | {"base": 500000.0}},
         r"`gauge\.base` must be left unset when `gauge\.preset` = 'llama3' \(the preset sets it\); "
         r"got 500000\.0\."),
        ({"gauge": {"kind": "rope", "scaling": "none"}},
         r"`gauge\.scaling` must be left at 'preset' unless `gauge\.preset` names a model; got 'none'\."),
        ({"gauge": {"kind": "rope", "preset": "llama4"}}, r"`gauge\.preset` must be one of .*'llama4'"),
    ],
)  # fmt: skip
def test_config_presets_refuse_what_does_not_fit(data, pattern):
    from attnflow.io.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match=rf"^config: {pattern}"):
        config_from_dict(MODEL | data)
