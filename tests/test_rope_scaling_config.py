"""A context-extension rule named in a config (`gauge.scaling` = 'linear', 'ntk', 'yarn', 'llama3'
with `gauge.scaling_factor`, `gauge.original_context` and the rule's parameters): the gauge it builds
has the rule's frequencies, YaRN's attention factor multiplies beta, each wrong combination is one
line naming the key, and `attnflow config show` prints the keys."""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from typer.testing import CliRunner

from attnflow.cli import app
from attnflow.core import rope_presets
from attnflow.core.rope_presets import Scaling, get_preset, scaled_frequencies
from attnflow.io.config import ConfigError, config_from_dict, load_config, resolved_dict
from attnflow.io.config_rules import SCALING_KEYS
from attnflow.workflows.build import build, dynamics_beta, make_gauge, make_labels, rope_scaling

N = 8
YARN_FACTOR_4 = 1.138629436111989  # 0.1 ln 4 + 1, by hand: ln 4 = 1.3862943611198906


def _config(preset: str, beta: float = 1.0, **gauge):
    return config_from_dict(
        {
            "model": {"n": N, "d": get_preset(preset).head_dim, "beta": beta},
            "aux": {"kind": "positions"},
            "gauge": {"kind": "rope", "preset": preset, **gauge},
        }
    )


def _frequencies(config) -> np.ndarray:
    """The frequencies of the config's gauge, read back from its angles at position 1."""
    angles = np.asarray(make_gauge(config, make_labels(config), jnp.float64).angles)
    np.testing.assert_array_equal(angles, np.outer(np.arange(N, dtype=float), angles[1]))  # xi_i = i
    return angles[1]


# --- the frequencies --------------------------------------------------------------------------------

CASES = [  # (preset, gauge keys, the Scaling they stand for)
    ("llama2", {"scaling": "linear", "scaling_factor": 2.0}, Scaling("linear", 2.0, 4096)),
    ("llama2", {"scaling": "ntk", "scaling_factor": 4.0}, Scaling("ntk", 4.0, 4096)),
    ("qwen2", {"scaling": "yarn", "scaling_factor": 4.0}, Scaling("yarn", 4.0, 32768)),
    (
        "mistral",
        {"scaling": "yarn", "scaling_factor": 8.0, "original_context": 8192, "beta_fast": 16.0,
         "beta_slow": 2.0},
        Scaling("yarn", 8.0, 8192, beta_fast=16.0, beta_slow=2.0),
    ),
    ("llama3", {"scaling": "llama3", "scaling_factor": 8.0, "original_context": 8192},
     Scaling("llama3", 8.0, 8192)),
    (
        "gpt-neox",
        {"scaling": "llama3", "scaling_factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0},
        Scaling("llama3", 4.0, 2048, low_freq_factor=2.0, high_freq_factor=8.0),
    ),
]  # fmt: skip


@pytest.mark.parametrize(("preset", "gauge", "scaling"), CASES, ids=lambda c: str(c)[:40])
def test_a_rule_in_the_config_gives_scaled_frequencies_with_that_rule(preset, gauge, scaling):
    config = _config(preset, **gauge)
    assert rope_scaling(config) == scaling
    got = _frequencies(config)
    expected = scaled_frequencies(get_preset(preset), scaling)
    np.testing.assert_array_equal(got, expected)
    assert not np.array_equal(got, rope_presets.base_frequencies(get_preset(preset)))  # the rule acted


def test_linear_x2_on_llama2_halves_every_frequency_exactly():
    got = _frequencies(_config("llama2", scaling="linear", scaling_factor=2.0))
    np.testing.assert_array_equal(got, rope_presets.base_frequencies(get_preset("llama2")) / 2)
    by_hand = [10000.0 ** (-2 * k / 128) / 2 for k in range(64)]  # θ^{-2k/r} / s
    np.testing.assert_allclose(got, by_hand, rtol=1e-15)  # NumPy's and Python's pow: a last bit apart
    assert got[0] == 0.5


def test_yarn_x4_on_qwen2_keeps_the_fast_pairs_and_divides_the_slow_ones_by_4():
    # by hand: pair k turns L ω_k / 2π times over L = 32768 with ω_k = 10^{-6k/64}; 32 turns at
    # k = 64 ln(32768 / 64π) / ln 10^6 = 23.6 and 1 turn at k = 39.6: pairs 0..23 kept, 40..63 over 4
    omega = rope_presets.base_frequencies(get_preset("qwen2"))
    turns = 32768 * omega / (2 * math.pi)
    assert turns[23] > 32 > turns[24] and turns[39] > 1 > turns[40]
    got = _frequencies(_config("qwen2", scaling="yarn", scaling_factor=4.0))
    np.testing.assert_array_equal(got[:24], omega[:24])
    np.testing.assert_array_equal(got[40:], omega[40:] / 4)
    assert np.all((got[24:40] < omega[24:40]) & (got[24:40] > omega[24:40] / 4))  # the ramp


def test_llama3_x8_on_llama3_from_the_config_is_llama31_s_published_rope():
    mine = _frequencies(_config("llama3", scaling="llama3", scaling_factor=8.0, original_context=8192))
    np.testing.assert_array_equal(mine, _frequencies(_config("llama3.1")))


def test_the_original_context_defaults_to_the_preset_s_context():
    unset = _frequencies(_config("qwen2", scaling="yarn", scaling_factor=4.0))
    np.testing.assert_array_equal(unset, _frequencies(_config("qwen2", scaling="yarn", scaling_factor=4.0,
                                                              original_context=32768)))  # fmt: skip
    shorter = _frequencies(_config("qwen2", scaling="yarn", scaling_factor=4.0, original_context=4096))
    assert not np.array_equal(unset, shorter)


# --- YaRN's attention factor on beta ----------------------------------------------------------------


def test_yarn_multiplies_beta_by_its_attention_factor_squared_and_the_other_rules_do_not():
    assert 0.1 * math.log(4.0) + 1.0 == pytest.approx(YARN_FACTOR_4, rel=1e-16)
    yarn = _config("qwen2", beta=2.0, scaling="yarn", scaling_factor=4.0)
    assert dynamics_beta(yarn) == pytest.approx(2.0 * YARN_FACTOR_4**2, rel=1e-15)
    for gauge in ({"scaling": "linear", "scaling_factor": 4.0}, {"scaling": "none"}, {}):
        assert dynamics_beta(_config("qwen2", beta=2.0, **gauge)) == 2.0
    assert dynamics_beta(_config("llama3.1", beta=2.0)) == 2.0  # the llama3 rule has no factor


def test_yarn_from_a_preset_s_own_rule_multiplies_beta_too(monkeypatch):
    yarn = dataclasses.replace(get_preset("qwen2"), scaling=Scaling("yarn", 4.0, 32768))
    monkeypatch.setitem(rope_presets.PRESETS, "qwen2", yarn)
    config = _config("qwen2", beta=2.0)  # gauge.scaling = "preset"
    assert float(build(config).kernel.profile.beta) == pytest.approx(2.0 * YARN_FACTOR_4**2, rel=1e-15)
    assert dynamics_beta(_config("qwen2", beta=2.0, scaling="none")) == 2.0


def test_the_log_n_beta_is_multiplied_as_well():
    config = config_from_dict(
        {
            "model": {"n": N, "d": 128, "beta_scaling": "log_n", "gamma": 0.5},
            "gauge": {"kind": "rope", "preset": "qwen2", "scaling": "yarn", "scaling_factor": 4.0},
        }
    )
    beta = float(build(config).kernel.profile.beta)
    assert beta == pytest.approx(0.5 * math.log(N) * YARN_FACTOR_4**2, rel=1e-15)


# --- refusals ---------------------------------------------------------------------------------------

MODEL = {"model": {"n": N, "d": 128}, "aux": {"kind": "positions"}}
QWEN = {"kind": "rope", "preset": "qwen2"}
RULES = "'linear', 'ntk', 'yarn' or 'llama3'"


@pytest.mark.parametrize(
    ("gauge", "message"),
    [
        ({"kind": "rope", "scaling": "yarn", "scaling_factor": 4.0},
         "`gauge.scaling` must be left at 'preset' unless `gauge.preset` names a model; got 'yarn'. A rule "
         "rescales a published model's RoPE: set gauge.preset too (e.g. 'qwen2')."),
        ({"kind": "none", "preset": "qwen2", "scaling": "yarn", "scaling_factor": 4.0},
         "`gauge.kind` must be 'rope' when `gauge.preset` is set; got 'none'."),
        (QWEN | {"scaling": "yarn"},
         "`gauge.scaling_factor` must be a number >= 1 when `gauge.scaling` = 'yarn' (the rule's factor s); "
         "got no value. For example: scaling_factor = 4.0 (a context four times the original)."),
        (QWEN | {"scaling": "linear", "scaling_factor": 0.5},
         "`gauge.scaling_factor` must be a number >= 1; got 0.5."),
        (QWEN | {"scaling_factor": 4.0},
         f"`gauge.scaling_factor` must be left out unless `gauge.scaling` names a rule ({RULES}); got 4.0. "
         "gauge.scaling = 'preset' takes no factor."),
        ({"kind": "none", "scaling_factor": 2.0},
         f"`gauge.scaling_factor` must be left out unless `gauge.scaling` names a rule ({RULES}); got 2.0. "
         "gauge.scaling = 'preset' takes no factor."),
        (QWEN | {"scaling": "none", "original_context": 4096},
         "`gauge.original_context` must be left out unless `gauge.scaling` is a rule that reads it ('yarn' "
         "or 'llama3'); got 4096. gauge.scaling = 'none' does not read it."),
        (QWEN | {"scaling": "linear", "scaling_factor": 2.0, "original_context": 4096},
         "`gauge.original_context` must be left out unless `gauge.scaling` is a rule that reads it ('yarn' "
         "or 'llama3'); got 4096. gauge.scaling = 'linear' does not read it."),
        (QWEN | {"scaling": "llama3", "scaling_factor": 2.0, "beta_fast": 16.0},
         "`gauge.beta_fast` must be left out unless `gauge.scaling` is a rule that reads it ('yarn'); got "
         "16.0. gauge.scaling = 'llama3' does not read it."),
        (QWEN | {"scaling": "yarn", "scaling_factor": 2.0, "low_freq_factor": 2.0},
         "`gauge.low_freq_factor` must be left out unless `gauge.scaling` is a rule that reads it "
         "('llama3'); got 2.0. gauge.scaling = 'yarn' does not read it."),
        (QWEN | {"scaling": "llama3", "scaling_factor": 2.0, "high_freq_factor": 1.0},
         "`gauge.high_freq_factor` must be greater than `gauge.low_freq_factor` = 1.0; got 1.0."),
        (QWEN | {"scaling": "yarn", "scaling_factor": 2.0, "beta_slow": 40.0},
         "`gauge.beta_fast` must be greater than `gauge.beta_slow` = 40.0; got 32.0."),
        (QWEN | {"scaling": "dynamic"},
         "`gauge.scaling` must be one of 'preset', 'none', 'linear', 'ntk', 'yarn', 'llama3'; got "
         "'dynamic'."),
    ],
)  # fmt: skip
def test_each_wrong_combination_is_one_line_naming_the_key(gauge, message):
    with pytest.raises(ConfigError) as info:
        config_from_dict(MODEL | {"gauge": gauge})
    assert str(info.value) == f"config: {message}"


def test_the_library_refuses_rule_parameters_out_of_order():
    with pytest.raises(
        ValueError, match=r"^rope preset: `beta_fast` must be greater than `beta_slow` = 2\.0"
    ):
        Scaling("yarn", 4.0, 4096, beta_fast=2.0, beta_slow=2.0)
    with pytest.raises(ValueError, match=r"^rope preset: `high_freq_factor` must be greater than"):
        Scaling("llama3", 4.0, 4096, low_freq_factor=4.0, high_freq_factor=1.0)


# --- the command line -------------------------------------------------------------------------------

YARN_TOML = """[model]
n = 8
d = 128
[gauge]
kind = "rope"
preset = "qwen2"
scaling = "yarn"
scaling_factor = 4.0
original_context = 32768
beta_fast = 16.0
[solver]
t_end = 0.1
"""


def test_config_show_prints_the_rule_s_keys_and_reads_back(tmp_path):
    path = tmp_path / "yarn.toml"
    path.write_text(YARN_TOML)
    result = CliRunner().invoke(app, ["config", "show", str(path)])
    assert result.exit_code == 0, result.output
    shown = tomllib.loads(result.stdout)["gauge"]
    written = {"preset": "qwen2", "scaling": "yarn", "scaling_factor": 4.0, "original_context": 32768}
    assert {k: shown[k] for k in written} == written and shown["beta_fast"] == 16.0
    assert shown["beta_slow"] == 1.0  # a key the rule reads is shown at its default too
    assert "low_freq_factor" not in shown and "high_freq_factor" not in shown  # llama3's
    assert config_from_dict(tomllib.loads(result.stdout)) == load_config(path)


def test_resolved_configs_without_a_rule_are_what_they_were():
    plain = resolved_dict(_config("llama3.1"))["gauge"]
    assert plain["preset"] == "llama3.1" and not set(plain) & {name for name, _ in SCALING_KEYS}
    assert "scaling_factor" not in plain and "scaling" not in plain
    linear = resolved_dict(_config("llama2", scaling="linear", scaling_factor=2.0))["gauge"]
    assert (linear["scaling"], linear["scaling_factor"]) == ("linear", 2.0)
    assert not set(linear) & {name for name, _ in SCALING_KEYS}


def test_a_refused_rule_exits_2_in_one_line_and_writes_nothing(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(YARN_TOML.replace("scaling_factor = 4.0\n", ""))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(out)])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"error: {path}: `gauge.scaling_factor` must be a number >= 1 when `gauge.scaling` = 'yarn' (the "
        "rule's factor s); got no value. For example: scaling_factor = 4.0 (a context four times the "
        "original)."
    ]
    assert not out.exists()
    result = CliRunner().invoke(
        app, ["run", str(path), "--set", "gauge.scaling_factor=0.5", "--out", str(out)]
    )
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: --set: `gauge.scaling_factor` must be a number >= 1; got 0.5."
    ]
    assert not out.exists()


# --- the documented examples ------------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[1] / "docs" / "transformer-layer.md"


@pytest.mark.parametrize(
    ("rule", "scaling"),
    [
        ("yarn", Scaling("yarn", 4.0, 32768)),
        ("linear", Scaling("linear", 2.0, 4096)),
        ("ntk", Scaling("ntk", 4.0, 4096)),
        ("llama3", get_preset("llama3.1").scaling),  # as documented: the llama3.1 preset's own rule
    ],
)
def test_the_documented_examples_are_valid_configs_with_their_rule(rule, scaling):
    blocks = re.findall(r"^```toml\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.S | re.M)
    mine = [block for block in blocks if f'scaling = "{rule}"' in block]
    assert len(mine) == 1, f"one example with scaling = {rule!r}"
    config = config_from_dict(tomllib.loads(mine[0]))
    assert rope_scaling(config) == scaling
