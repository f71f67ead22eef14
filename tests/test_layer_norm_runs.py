"""Layer norms from a config (`model.layer_norm`, `model.ngpt_alpha`): the acceptance check of runs
against an independent NumPy RK4 of the definitions (heads, a RoPE gauge, a factor, a held source;
tau = 1, dt = 0.01, within 1e-8), the radii stored beside x and resumed bitwise, the metrics, each
combination that runs or is refused in one line, and the example config."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import zarr
from typer.testing import CliRunner

from attnflow.cli import app
from attnflow.io.config import ConfigError, config_from_dict, config_hash, load_config, resolved_dict
from attnflow.io.store import open_dataset, read_trajectory
from attnflow.workflows import run as run_module
from attnflow.workflows.build import build
from configs import toml_text, write_config
from test_heads import factor_matrix, rope_matrices
from test_layer_norms import reference_rk4

ROOT = Path(__file__).resolve().parents[1]
ACCEPTANCE_ATOL = 1e-8  # the bound at tau = 1, dt = 0.01 (measured: ~1e-15, round-off)
N, D, HEAD_DIM, BETA, SLOPE, ALPHA = 16, 6, 4, 1.5, 0.2, 2.0
FREQUENCIES = [0.4, 1.3]


def invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def metrics_of(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


# --- the acceptance check -------------------------------------------------------------------------


def _weights(folder: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    maps = {
        "query": rng.normal(size=(2, HEAD_DIM, D)) / np.sqrt(D),
        "key": rng.normal(size=(2, HEAD_DIM, D)) / np.sqrt(D),
        "value": rng.normal(size=(2, HEAD_DIM, D)) / np.sqrt(D),
        "output": rng.normal(size=(2, D, HEAD_DIM)) / np.sqrt(HEAD_DIM),
    }
    np.savez(folder / "w.npz", **maps)
    return maps


def _acceptance_config(kind: str, heads: bool, folder: Path) -> Path:
    config = {
        "model": {"n": N, "d": D if heads else HEAD_DIM, "beta": BETA, "sources": 1, "layer_norm": kind},
        "aux": {"kind": "positions"},
        "gauge": {"kind": "rope", "frequencies": FREQUENCIES},
        "factor": {"kind": "distance_bias", "slope": SLOPE},
        "init": {"kind": "uniform", "seed": 3},
        "solver": {"method": "rk4", "dt": 0.01, "t_end": 1.0, "save_every": 0.1},
    }
    if kind == "ngpt":
        config["model"]["ngpt_alpha"] = ALPHA
    if heads:
        config["attention"] = {"heads": 2, "head_dim": HEAD_DIM, "values": "plain", "weights": "w.npz"}
    path = folder / f"{kind}.toml"
    path.write_text(toml_text(config))
    return path


def _reference_specs(heads: bool, maps: dict[str, np.ndarray]) -> list[dict]:
    """The layer, written from its formulas: positions xi_i = i, RoPE on the pairs (2k, 2k+1),
    w_ij = exp(-m |i - j|); heads with plain values, or the paper's field (identity maps, rotated
    values)."""
    xi = np.arange(N, dtype=float)
    common = {"g": rope_matrices(xi, FREQUENCIES, HEAD_DIM), "w": factor_matrix("distance_bias", xi, SLOPE)}
    if not heads:
        eye = np.eye(HEAD_DIM)
        return [{**common, "query": eye, "key": eye, "value": eye, "output": eye, "values": "rotated"}]
    names = ("query", "key", "value", "output")
    return [{**common, **{name: maps[name][h] for name in names}, "values": "plain"} for h in range(2)]


@pytest.mark.parametrize("heads", [True, False], ids=["heads", "paper_field"])
@pytest.mark.parametrize("kind", ["pre", "peri", "ngpt"])
def test_runs_from_a_config_equal_an_independent_rk4_of_the_definitions(kind, heads, tmp_path):
    """`attnflow run` of pre, peri and nGPT with heads (or the paper's rotated field), a RoPE gauge,
    a distance bias and a held source, against a NumPy RK4 of SPEC's ODEs with the same stage rule
    (z unretracted for pre and peri, x renormalised for nGPT): the stored z = r x (x for nGPT) at
    tau = 1 within 1e-8."""
    maps = _weights(tmp_path)
    out = tmp_path / "run"
    result = invoke("run", _acceptance_config(kind, heads, tmp_path), "--out", out)
    assert result.exit_code == 0, result.output
    stored = read_trajectory(out / "trajectory.zarr")
    z = stored.xs[-1] if stored.rs is None else stored.xs[-1] * stored.rs[-1][:, None]
    x0 = np.random.default_rng(3).standard_normal((N, D if heads else HEAD_DIM))
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    expected = reference_rk4(x0, _reference_specs(heads, maps), kind=kind, dt=0.01, steps=100, beta=BETA,
                             alpha=ALPHA, sources=1)  # fmt: skip
    error = float(np.max(np.abs(z - expected)))
    assert stored.ts[-1] == 1.0 and error <= ACCEPTANCE_ATOL, error
    assert (stored.rs is None) == (kind == "ngpt")
    moved = np.max(np.abs(z - x0), axis=1)
    # the source is held (nGPT renormalises it each step: a rounding), the others move
    assert moved[0] <= 2e-16 and np.all(moved[1:] > 1e-3)


# --- what a run stores and reports ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["post", "pre", "peri", "ngpt"])
def test_pre_and_peri_store_radii_beside_x_and_report_them(kind, tmp_path):
    path = write_config(tmp_path, {"model": {"layer_norm": kind}})
    out = tmp_path / "run"
    result = invoke("run", path, "--out", out)
    assert result.exit_code == 0, result.output
    group = zarr.open_group(out / "trajectory.zarr", mode="r")
    metrics, resolved = metrics_of(out), json.loads((out / "config.json").read_text())
    radial = kind in ("pre", "peri")
    assert ("r" in group) == radial and ("radius_mean" in metrics) == radial
    assert ("layer_norm" in resolved["model"]) == (kind != "post")  # the paper's config as it was
    assert metrics["run"].get("layer_norm") == (None if kind == "post" else kind)
    stored = read_trajectory(out / "trajectory.zarr")
    np.testing.assert_allclose(np.linalg.norm(stored.xs, axis=-1), 1.0, atol=1e-15)  # directions
    if not radial:
        assert stored.rs is None and "radius" not in metrics["methods"]
        return
    ds = open_dataset(out / "trajectory.zarr")
    assert ds["r"].dims == ("t", "token") and ds["r"].shape == (5, 16)
    np.testing.assert_allclose(stored.rs[0], 1.0, atol=1e-15)  # r(0) = 1
    final = stored.rs[-1]
    assert metrics["radius_mean"] == pytest.approx(final.mean(), rel=1e-15)
    assert metrics["radius_max"] == float(final.max()) and metrics["radius_min"] == float(final.min())
    assert metrics["series"]["radius_max"] == [float(r.max()) for r in stored.rs]
    assert np.ptp(final) > 1e-3  # the radii moved apart
    assert metrics["energy_max"] is not None and metrics["energy_monotone"] is True  # E still ascends
    assert metrics["gradient_flow"] is False and "layer norm" in metrics["methods"]["energy_monotone"]


@pytest.mark.parametrize("kind", ["pre", "peri"])
@pytest.mark.parametrize("kept", [1, 3])
def test_an_interrupted_radial_run_resumes_bitwise(kind, kept, tmp_path):
    """Stopped after `kept` snapshots and resumed from z = r x as stored: x and r bitwise those of
    the run that never stopped."""
    config = load_config(write_config(tmp_path, {"model": {"layer_norm": kind}}), [])
    whole = tmp_path / "whole"
    run_module.run(config, whole)

    def stop(done: int, total: int) -> None:  # noqa: ARG001
        if done == kept:
            raise KeyboardInterrupt

    out = tmp_path / "run"
    with pytest.raises(run_module.RunInterrupted, match=f"kept {kept} of 5 snapshots"):
        run_module.run(config, out, progress=stop)
    assert read_trajectory(out / "trajectory.zarr").rs.shape == (kept, 16)
    run_module.run(config, out, resume=True)
    reference, resumed = read_trajectory(whole / "trajectory.zarr"), read_trajectory(out / "trajectory.zarr")
    assert resumed.status == "ok"
    np.testing.assert_array_equal(resumed.ts, reference.ts)
    np.testing.assert_array_equal(resumed.xs, reference.xs)
    np.testing.assert_array_equal(resumed.rs, reference.rs)
    assert metrics_of(out)["radius_mean"] == metrics_of(whole)["radius_mean"]


def test_a_zero_attention_output_keeps_its_token_in_a_run(tmp_path):
    """A strict causal mask: token 0 attends to nothing (A_0 = 0); under peri-LN (A/|A| taken as 0)
    it keeps its direction and its radius, while the others move."""
    path = write_config(tmp_path, {"model": {"layer_norm": "peri", "causal": "strict"}})
    assert invoke("run", path, "--out", tmp_path / "run").exit_code == 0
    stored = read_trajectory(tmp_path / "run" / "trajectory.zarr")
    np.testing.assert_array_equal(stored.xs[:, 0], np.broadcast_to(stored.xs[0, 0], (5, 3)))
    np.testing.assert_array_equal(stored.rs[:, 0], stored.rs[0, 0])
    assert np.max(np.abs(stored.rs[-1, 1:] - 1.0)) > 1e-3


# --- combinations that run ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {"solver": {"method": "adaptive"}},
        {"solver": {"dtype": "float32"}},
        {"solver": {"method": "euler"}},
        {"storage": {"token_stride": 2}},
        {"storage": {"snapshots": "final"}},
        {"model": {"normalization": "sa", "causal": True, "sources": 2}},
        {"gauge": {"kind": "prompt"}, "aux": {"kind": "prompts"}},
        {"attention": {"heads": 2, "head_dim": 2, "weights": "orthogonal", "alibi": True},
         "factor": {"kind": "distance_bias"}},
    ],
    ids=["adaptive", "float32", "euler", "stride", "final_only", "causal_sa_sources", "prompt", "heads"],
)  # fmt: skip
def test_pre_ln_runs_with_each_option(changes, tmp_path):
    base = {"model": {"layer_norm": "pre"}}
    merged = {**changes, "model": {**base["model"], **changes.get("model", {})}}
    out = tmp_path / "run"
    result = invoke("run", write_config(tmp_path, merged), "--out", out)
    assert result.exit_code == 0, result.output
    stored = read_trajectory(out / "trajectory.zarr")
    tokens = 8 if "storage" in changes and "token_stride" in changes["storage"] else 16
    assert stored.rs.shape == (stored.xs.shape[0], tokens) and stored.rs.dtype == stored.xs.dtype
    assert np.all(np.isfinite(stored.rs)) and np.max(np.abs(stored.rs[-1] - 1.0)) > 1e-4
    assert metrics_of(out)["run"]["status"] == "ok"


def test_the_expansion_runs_every_norm_within_its_tolerance(tmp_path):
    """solver.interaction = 'expansion' (O(n) sums) against the exact sums, pre-LN, d = 3."""
    finals = {}
    for interaction in ("exact", "expansion"):
        out = tmp_path / interaction
        config = {"model": {"layer_norm": "pre"}, "solver": {"interaction": interaction}}
        path = write_config(tmp_path, config, name=f"{interaction}.toml")
        assert invoke("run", path, "--out", out).exit_code == 0
        stored = read_trajectory(out / "trajectory.zarr")
        finals[interaction] = stored.xs[-1] * stored.rs[-1][:, None]
    assert metrics_of(tmp_path / "expansion")["run"]["interaction"] == "expansion"
    # the expansion's bound 1e-10 of the field's scale per evaluation, over 40 steps
    np.testing.assert_allclose(finals["expansion"], finals["exact"], rtol=0, atol=1e-8)


def test_ngpt_runs_with_noise(tmp_path):
    path = write_config(tmp_path, {"model": {"layer_norm": "ngpt", "ngpt_alpha": 0.5, "noise": 0.1}})
    assert invoke("run", path, "--out", tmp_path / "run").exit_code == 0
    stored = read_trajectory(tmp_path / "run" / "trajectory.zarr")
    np.testing.assert_allclose(np.linalg.norm(stored.xs, axis=-1), 1.0, atol=1e-15)


# --- the config and its refusals ------------------------------------------------------------------


def test_the_keys_leave_the_paper_s_config_and_hash_alone():
    assert config_hash(config_from_dict({})) == "1f6c3cfa19e7"  # as before the keys existed
    assert config_hash(config_from_dict({"model": {"layer_norm": "post"}})) == "1f6c3cfa19e7"
    assert "layer_norm" not in resolved_dict(config_from_dict({}))["model"]
    pre = config_from_dict({"model": {"layer_norm": "pre"}})
    assert resolved_dict(pre)["model"]["layer_norm"] == "pre" and config_hash(pre) != "1f6c3cfa19e7"
    ngpt = config_from_dict({"model": {"layer_norm": "ngpt", "ngpt_alpha": 2.0}})
    assert resolved_dict(ngpt)["model"]["ngpt_alpha"] == 2.0


REFUSED = [
    ({"layer_norm": "mix"}, r"`model\.layer_norm` must be one of 'post', 'pre', 'peri', 'ngpt'; got 'mix'\."),
    ({"layer_norm": "ngpt", "ngpt_alpha": 0}, r"`model\.ngpt_alpha` must be a number > 0; got 0\."),
    ({"layer_norm": "ngpt", "ngpt_alpha": -1.5}, r"`model\.ngpt_alpha` must be a number > 0; got -1\.5\."),
    ({"layer_norm": "pre", "ngpt_alpha": 2.0},
     r"`model\.ngpt_alpha` must be left out when `model\.layer_norm` = 'pre' \(which does not read it\); "
     r"got 2\.0\. Remove it; it is read when `model\.layer_norm` is 'ngpt'\."),
    ({"ngpt_alpha": 2.0}, r"`model\.ngpt_alpha` must be left out when `model\.layer_norm` = 'post'"),
    ({"layer_norm": "peri", "noise": 0.1},
     r"`model\.noise` must be 0 when `model\.layer_norm` = 'peri' \(the noise is defined on the sphere"),
    ({"layer_norm": "pre", "method": "geodesic_rk4"},
     r"`solver\.method` must be 'euler', 'rk4' or 'adaptive' when `model\.layer_norm` = 'pre'"),
]  # fmt: skip


@pytest.mark.parametrize(("model", "message"), REFUSED, ids=[str(i) for i in range(len(REFUSED))])
def test_bad_layer_norm_input_is_one_line_exit_2_and_nothing_written(model, message, tmp_path):
    method = model.pop("method", None)
    changes = {"model": model} | ({"solver": {"method": method}} if method else {})
    path = write_config(tmp_path / "in", changes)
    out = tmp_path / "out"
    result = invoke("run", path, "--out", out)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {path}: ") and re.search(message, line), line
    assert not out.exists()


def test_commands_of_the_paper_s_layer_refuse_another_norm_in_one_line(tmp_path):
    """The landscape (and the experiments, through build) study the post-LN layer: another norm is
    refused before anything is written."""
    config = config_from_dict({"model": {"n": 8, "layer_norm": "peri"}})
    refusal = r"^config: `model\.layer_norm` must be 'post' here \(the experiments and the landscape"
    with pytest.raises(ConfigError, match=refusal):
        build(config)
    assert type(build(config, layer_norms=True).field).__name__ == "LayerNormField"
    path = write_config(tmp_path / "in", {"model": {"layer_norm": "peri"}})
    out = tmp_path / "landscape"
    result = invoke("landscape", path, "--out", out, "--starts", "1")
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert "`model.layer_norm` must be 'post' here" in line and not out.exists()


def test_resume_of_an_adaptive_radial_run_is_refused(tmp_path):
    path = write_config(tmp_path, {"model": {"layer_norm": "peri"}, "solver": {"method": "adaptive"}})
    out = tmp_path / "run"
    assert invoke("run", path, "--out", out).exit_code == 0
    assert read_trajectory(out / "trajectory.zarr").rs is not None
    result = invoke("run", path, "--out", out, "--resume")
    assert result.exit_code == 2
    assert "`--resume` must continue a deterministic fixed-step run" in result.stderr


# --- the example ----------------------------------------------------------------------------------


def test_the_example_config_runs(tmp_path):
    example = ROOT / "examples" / "layer_norm.toml"
    out = tmp_path / "run"
    result = invoke("run", example, "--out", out)
    assert result.exit_code == 0, result.output
    metrics = metrics_of(out)
    assert metrics["run"]["layer_norm"] == "pre" and metrics["radius_max"] > metrics["radius_min"] > 1.0
    assert read_trajectory(out / "trajectory.zarr").rs.shape[1] == load_config(example, []).model.n
