"""`attnflow run` over mutated configs (hypothesis): every input is either refused as bad input
(exit 2, one line, nothing written to --out) or starts a run whose folder records its status in
metrics.json (exit 0 for ``ok``, 3 for a run that did not finish as asked). Never a traceback."""

import json
import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from attnflow.cli import app
from configs import small_config, toml_text

BASE = small_config({"model": {"n": 8}, "solver": {"t_end": 0.5, "save_every": 0.25}})  # 10 steps of rk4

KEYS = {
    "model": ["n", "d", "beta", "time_scale", "profile", "normalization", "causal", "value", "noise"],
    "aux": ["kind", "spacing", "n_prompts", "assignment", "seed", "path"],
    "gauge": ["kind", "frequencies", "base", "axes", "rates", "omega", "seed", "path"],
    "factor": ["kind", "slope", "omega", "path"],
    "init": ["kind", "seed", "center", "sigma", "rho0", "path"],
    "solver": ["method", "dt", "t_end", "save_every", "rtol", "atol", "dtype", "block_size", "interaction",
               "tolerance"],
}  # fmt: skip

VALUES = st.sampled_from(
    [
        # integers: negative, zero, small, past int64
        -(2**63) - 1, -1, 0, 1, 2, 7, 2**31, 2**63, 2**64,
        # floats: tiny, huge, non-finite
        -1.0, 0.0, 1e-300, 1e-12, 0.3, 2.5, 1e8, 1e308, math.inf, -math.inf, math.nan,
        # strings, booleans, lists
        "", "x", "rk4", "roformer", "file", "expansion", "float32", "positions", True, False,
        [], [1.0], [0.5, 0.25], ["x"], [[1.0]],
    ]
)  # fmt: skip

MUTATIONS = st.one_of(
    st.sampled_from(sorted(KEYS)).flatmap(
        lambda section: st.tuples(st.just(section), st.sampled_from(KEYS[section]), VALUES)
    ),
    st.tuples(
        st.sampled_from(sorted(KEYS)), st.sampled_from(["bogus", "N", "beta2"]), VALUES
    ),  # unknown keys
    st.tuples(st.just("extra"), st.just("key"), VALUES),  # an unknown section
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutation=MUTATIONS)
@example(mutation=("aux", "spacing", 1e308))  # positions overflow: refused before the folder is made
@example(mutation=("solver", "save_every", 1e308))  # save_every / dt overflows: refused, no traceback
@example(mutation=("model", "n", 2))  # the smallest n: a shape class for two tokens
def test_a_mutated_config_is_refused_in_one_line_or_its_run_records_a_status(mutation):
    section, key, value = mutation
    data = {name: dict(keys) for name, keys in BASE.items()}
    data.setdefault(section, {})[key] = value
    with tempfile.TemporaryDirectory() as folder:
        path, out = Path(folder) / "mutated.toml", Path(folder) / "run"
        path.write_text(toml_text(data))
        result = CliRunner().invoke(app, ["run", str(path), "--out", str(out)])
        assert result.exit_code in (0, 2, 3), (mutation, result.output, result.exception)
        if result.exit_code == 2:
            lines = result.output.splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), (mutation, result.output)
            assert not out.exists(), mutation
            return
        metrics = json.loads((out / "metrics.json").read_text())  # strict JSON: no NaN or Infinity
        status = metrics["run"]["status"]
        assert (status == "ok") == (result.exit_code == 0), (mutation, status)
