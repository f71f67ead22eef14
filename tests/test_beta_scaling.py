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
