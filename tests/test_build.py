"""build(config): labels, gauges, initial data and options reach the runtime objects."""

import re
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.core.gauges import DenseGauge, IdentityGauge, RoPE
from attnflow.io.config import ConfigError, config_from_dict
from attnflow.workflows.build import build, make_labels, resolve_block_size


def cfg(**sections):
    return config_from_dict(sections)


@pytest.mark.parametrize(
    ("spacing", "expected"),
    [
        ("index", [0, 1, 2, 3]),
        ("unit", [0, 0.25, 0.5, 0.75]),
        ("midpoint", [0.125, 0.375, 0.625, 0.875]),
        (0.5, [0, 0.5, 1, 1.5]),
    ],
)
def test_position_labels(spacing, expected):
    config = cfg(model={"n": 4}, aux={"kind": "positions", "spacing": spacing})
    np.testing.assert_array_equal(make_labels(config), expected)  # exact arithmetic on small numbers


def test_prompt_labels_cyclic_and_random():
    cyclic = make_labels(cfg(model={"n": 6}, aux={"kind": "prompts", "n_prompts": 4}))
    np.testing.assert_array_equal(cyclic, [0, 1, 2, 3, 0, 1])
    random = make_labels(
        cfg(model={"n": 200}, aux={"kind": "prompts", "n_prompts": 3, "assignment": "random"})
    )
    assert set(np.unique(random)) == {0, 1, 2}


def test_gauge_kinds_are_built():
    base = {"model": {"n": 8}, "aux": {"kind": "positions"}}
    assert isinstance(build(cfg(**base)).kernel.gauge, IdentityGauge)
    assert isinstance(build(cfg(**base, gauge={"kind": "rope"})).kernel.gauge, RoPE)
    assert isinstance(build(cfg(**base, gauge={"kind": "generalized_rope"})).kernel.gauge, DenseGauge)
    prompts = cfg(model={"n": 8}, aux={"kind": "prompts"}, gauge={"kind": "prompt"})
    sim = build(prompts)
    q = np.asarray(sim.kernel.gauge.matrices())
    np.testing.assert_allclose(q[0], q[4], atol=0)  # same prompt id, same matrix
    np.testing.assert_array_equal(sim.groups, [0, 1, 2, 3, 0, 1, 2, 3])


def test_cap_initial_data_is_centred_in_the_gauge_frame():
    config = cfg(
        model={"n": 64},
        aux={"kind": "positions"},
        gauge={"kind": "rope"},
        init={"kind": "cap", "center": [1.0, 0.0, 0.0], "sigma": 0.05},
    )
    sim = build(config)
    u0 = np.asarray(sim.kernel.gauge.apply(sim.x0))
    assert np.min(u0[:, 0]) > 0.9  # every u within ~0.05·few of the centre
    x0 = np.asarray(sim.x0)
    assert np.min(x0[:, 0]) < 0  # while the content is spread around the circle


def test_dtype_and_block_size_options():
    sim = build(cfg(model={"n": 8}, solver={"dtype": "float32", "block_size": 3}))
    assert sim.x0.dtype == jnp.float32
    assert sim.block_size == 3
    assert resolve_block_size(cfg(model={"n": 8}, solver={"block_size": 64})) is None  # one block = dense
    assert resolve_block_size(cfg(model={"n": 10_000})) is not None  # automatic blocking for large n


def test_stiffness_warning_names_the_largest_stable_step():
    # dt·c·e^β = 0.1·e^5 = 14.84; stable below 1/e^5 = 0.006738
    expected = r"^solver\.dt = 0\.1 .*dt·c·e\^β = 14\.8 > 1 .*consider dt <= 0\.00674\.$"
    with pytest.warns(UserWarning, match=expected):
        build(cfg(model={"n": 8, "beta": 5.0}, solver={"dt": 0.1, "t_end": 1.0, "save_every": 0.1}))


def test_a_ratio_just_above_one_is_shown_above_one():
    # 0.05·e^3 = 1.00428: "1.0043 > 1", not "1 > 1"
    with pytest.warns(UserWarning, match=r"dt·c·e\^β = 1\.0043 > 1 .*consider dt <= 0\.0498\.$"):
        build(cfg(model={"n": 8, "beta": 3.0}, solver={"dt": 0.05, "t_end": 1.0, "save_every": 0.1}))


def test_a_beta_whose_exponential_overflows_is_named_without_numpy_s_warning():
    """β = 800: c·e^β is not a float64 number, so no step is stable: the one warning says so (not
    "consider dt <= 0"), and NumPy's own overflow warning does not reach the user."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build(cfg(model={"n": 8, "beta": 800.0}, solver={"dt": 0.1, "t_end": 1.0, "save_every": 0.1}))
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages
    assert messages[0].startswith("solver.dt = 0.1 is outside the stable range: dt·c·e^β = inf > 1")
    assert messages[0].endswith("c·e^β itself overflows float64, so no step is stable: lower model.beta.")


def test_package_import_exposes_the_api_without_plotting():
    import subprocess
    import sys

    code = "import sys, attnflow; print(attnflow.Kernel.__name__, 'matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["Kernel", "False"]  # the public API is there; matplotlib was not imported


# --- memory estimate: impossible sizes refused in one line before anything is allocated ----------


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"model": {"n": 10**9}}, "model.n"),
        ({"model": {"n": 64, "d": 5000}, "aux": {"kind": "positions"}, "gauge": {"kind": "rope"}}, "model.d"),
        (
            {"model": {"n": 4096, "d": 64}, "solver": {"t_end": 100.0, "save_every": 0.01}},
            "solver.save_every",
        ),
    ],
)
def test_impossible_sizes_are_refused_naming_the_key(data, key):
    from attnflow.io.config import config_from_dict
    from attnflow.workflows.build import build, memory_estimate

    config = config_from_dict(data)
    limit = 2**30  # 1 GiB: every case needs more than 5 GiB by its leading term alone
    terms = memory_estimate(config)
    assert terms[key] > 5 * limit
    with pytest.raises(
        ConfigError, match=rf"^config: `{re.escape(key)}` must leave the run within memory"
    ) as e:
        build(config, memory_limit=limit)
    assert "\n" not in str(e.value) and "1 GiB available" in str(e.value)


def test_a_billion_tokens_exit_2_in_one_line_with_nothing_written(tmp_path):
    from typer.testing import CliRunner

    from attnflow.cli import app

    (tmp_path / "c.toml").write_text("[model]\nn = 1_000_000_000\n")
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(tmp_path / "c.toml"), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and "`model.n` must leave the run within memory" in result.stderr
    assert not out.exists()


def test_the_estimate_grows_with_each_size():
    from attnflow.io.config import config_from_dict
    from attnflow.workflows.build import memory_estimate

    base = sum(memory_estimate(config_from_dict({"model": {"n": 256}})).values())
    for data in (
        {"model": {"n": 512}},
        {"model": {"n": 256, "d": 6}},
        {"model": {"n": 256}, "solver": {"t_end": 40.0}},
    ):
        assert sum(memory_estimate(config_from_dict(data)).values()) > base


def test_memory_estimate_of_a_streamed_expansion_run_holds_no_snapshot_history():
    """attnflow run streams its snapshots and the expansion holds n x rank features, not pair
    blocks: the estimate of an n = 1e6 run with 201 snapshots stays within a machine's memory."""
    from attnflow.io.config import config_from_dict
    from attnflow.workflows.build import memory_estimate

    config = config_from_dict(
        {
            "model": {"n": 1_000_000},
            "solver": {"interaction": "expansion", "tolerance": 1e-8, "method": "adaptive"},
        }
    )
    held, streamed = memory_estimate(config), memory_estimate(config, streamed=True)
    assert held["solver.save_every"] == 3 * 201 * 1_000_000 * 3 * 8
    assert streamed["solver.save_every"] == 3 * (64 + 2) * 1_000_000 * 3 * 8
    from attnflow.numerics.expansion import expansion_rank

    rank = expansion_rank(3, 1.0, 1e-8)  # the features per token at beta = 1, tolerance 1e-8
    assert rank > 100
    assert streamed["model.n"] == 16 * 1_000_000 * 3 * 8 + 2 * 1_000_000 * rank * 8
    assert sum(streamed.values()) < 16 * 2**30  # a laptop's memory (8.1 GiB at rank 220)


def test_rope_at_large_d_counts_one_dense_copy_and_fits_24_gb():
    """The store keeps RoPE's angles: only the metrics' n x d x d matrices remain of the gauge."""
    from attnflow.io.config import config_from_dict
    from attnflow.workflows.build import check_memory, memory_estimate

    data = {"model": {"n": 64, "d": 5000}, "aux": {"kind": "positions"}, "gauge": {"kind": "rope"}}
    config = config_from_dict(data)
    dense = 64 * 5000 * 5000 * 8
    assert dense <= memory_estimate(config)["model.d"] <= dense + 64 * 8  # + the n x 1 angles
    for streamed in (True, False):
        check_memory(config, limit=24 * 10**9, streamed=streamed)  # does not raise
    generalized = config_from_dict({**data, "gauge": {"kind": "prompt"}, "aux": {"kind": "prompts"}})
    assert memory_estimate(generalized)["model.d"] >= 3 * dense  # dense gauges: simulation + 2 edges
