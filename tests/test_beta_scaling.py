"""`model.beta_scaling = "log_n"`: beta = gamma log n (the long-context regime), recorded in the run."""

import json
import math

import pytest
from typer.testing import CliRunner

from attnflow.cli import app
from attnflow.io.config import config_from_dict
from attnflow.workflows.build import build


@pytest.mark.parametrize("n", [16, 64])
def test_beta_is_gamma_log_n(n):
    config = config_from_dict({"model": {"n": n, "beta_scaling": "log_n", "gamma": 0.5, "beta": 3.0}})
    assert float(build(config).kernel.profile.beta) == pytest.approx(0.5 * math.log(n), rel=1e-15)
    plain = config_from_dict({"model": {"n": n, "beta": 3.0}})
    assert float(build(plain).kernel.profile.beta) == 3.0


def test_the_run_records_the_beta_it_ran(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[model]\nn = 32\nbeta_scaling = "log_n"\ngamma = 0.25\n[solver]\nt_end = 0.1\n')
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert metrics["run"]["beta"] == pytest.approx(0.25 * math.log(32), rel=1e-15)
    resolved = json.loads((tmp_path / "r" / "config.json").read_text())
    assert resolved["model"]["beta_scaling"] == "log_n" and resolved["model"]["gamma"] == 0.25


def test_a_yarn_run_records_beta_times_the_attention_factor_squared(tmp_path):
    """Qwen2 with YaRN x4 (its published long-context recipe): q and k carry 0.1 ln 4 + 1, so the
    logits, hence beta, its square; a run without a rule records beta as written."""
    factor = 1.138629436111989  # 0.1 ln 4 + 1 by hand (ln 4 = 1.3862943611198906)
    path = tmp_path / "c.toml"
    path.write_text(
        '[model]\nn = 8\nd = 128\nbeta = 2.0\n[gauge]\nkind = "rope"\npreset = "qwen2"\nscaling = "yarn"\n'
        "scaling_factor = 4.0\n[solver]\nt_end = 0.1\n"
    )
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    run = json.loads((tmp_path / "r" / "metrics.json").read_text())["run"]
    assert run["attention_factor"] == pytest.approx(factor, rel=1e-15)
    assert run["beta"] == pytest.approx(2.0 * factor**2, rel=1e-15)  # 2.5929539855614125
    linear = config_from_dict(
        {"model": {"n": 8, "d": 128, "beta": 2.0},
         "gauge": {"kind": "rope", "preset": "qwen2", "scaling": "linear", "scaling_factor": 4.0}}
    )  # fmt: skip
    sim = build(linear)
    assert (float(sim.kernel.profile.beta), sim.attention_factor) == (2.0, 1.0)
    assert build(config_from_dict({"model": {"n": 8, "beta": 2.0}})).attention_factor is None
