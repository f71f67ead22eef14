"""`attnflow run` over mutated configs (hypothesis): every input is either refused as bad input
(exit 2, one line, nothing written to --out) or starts a run whose folder records its status in
metrics.json (exit 0 for ``ok``, 3 for a run that did not finish as asked). Never a traceback."""

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from attnflow.cli import app
from configs import small_config, toml_text

BASE = small_config({"model": {"n": 8}, "solver": {"t_end": 0.5, "save_every": 0.25}})  # 10 steps of rk4

KEYS = {
    "model": ["n", "d", "beta", "time_scale", "profile", "normalization", "causal", "value", "noise",
              "sources"],
    "aux": ["kind", "spacing", "n_prompts", "assignment", "seed", "path"],
    "gauge": ["kind", "frequencies", "base", "axes", "rates", "omega", "seed", "path"],
    "factor": ["kind", "slope", "omega", "path"],
    "init": ["kind", "seed", "center", "sigma", "rho0", "path"],
    "solver": ["method", "dt", "t_end", "save_every", "rtol", "atol", "dtype", "block_size", "interaction",
               "tolerance", "max_steps"],
    "storage": ["token_stride", "dtype", "snapshots"],
    "attention": ["heads", "head_dim", "values", "weights", "scale", "seed", "alibi"],
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


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutation=MUTATIONS)
@example(mutation=("aux", "spacing", 1e308))  # positions overflow: refused before the folder is made
@example(mutation=("solver", "save_every", 1e308))  # save_every / dt overflows: refused, no traceback
@example(mutation=("model", "n", 2))  # the smallest n: a shape class for two tokens
@example(mutation=("solver", "block_size", 2**64))  # beyond int64: refused naming the key
@example(mutation=("storage", "token_stride", 2**63))
@example(mutation=("gauge", "omega", 2.5))  # a key RoPE does not read: refused
@example(mutation=("solver", "atol", 0.3))  # a key rk4 does not read: refused
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


# --- files and values at the edges: refused in one line, in seconds, writing nothing ---------------

LEVELS = 5000  # a 5000-deep array overflowed the TOML parser's recursion (a traceback, exit 1)


def _edge_config(folder: Path, case: str) -> str:
    """The config argument of one edge case (a path; some are made in ``folder``)."""
    path = folder / f"{case}.toml"
    if case == "fifo":  # opening it for reading blocked for ever
        os.mkfifo(path)
    elif case == "dev_zero":  # read to 5.3 GB in 60 s
        return "/dev/zero"
    elif case == "deep_array":
        path.write_text("[model]\nn = " + "[" * LEVELS + "]" * LEVELS + "\n")
    elif case == "deep_table":
        path.write_text("[model]\nn = " + "{a = " * LEVELS + "1" + "}" * LEVELS + "\n")
    elif case == "empty":  # ran a full default simulation
        path.write_text("")
    elif case.startswith("ignored_"):  # ignored without a word
        section, key, value = {
            "ignored_factor_path": ("factor", "path", "w.npy"),
            "ignored_gauge_omega": ("gauge", "omega", 1.0),
            "ignored_solver_atol": ("solver", "atol", 1e-6),
            "ignored_solver_max_steps": ("solver", "max_steps", 1000),  # an adaptive bound with rk4
        }[case]
        data = {name: dict(keys) for name, keys in BASE.items()}
        data.setdefault(section, {})[key] = value
        if section == "factor":
            data["factor"]["kind"] = "none"
        path.write_text(toml_text(data))
    elif case.startswith("int64_"):  # accepted beyond what the arrays hold
        section, key = {
            "int64_block_size": ("solver", "block_size"),
            "int64_token_stride": ("storage", "token_stride"),
        }[case]
        data = {name: dict(keys) for name, keys in BASE.items()}
        data.setdefault(section, {})[key] = 2**64
        path.write_text(toml_text(data))
    elif case == "adaptive_t_end":  # no step bound
        data = {name: dict(keys) for name, keys in BASE.items()}
        data["solver"] = {"method": "adaptive", "t_end": 1e12, "save_every": 0.25}
        path.write_text(toml_text(data))
    return str(path)


EDGE_CASES = {
    "fifo": "must be a regular TOML file; got 'a FIFO (named pipe)'.",
    "dev_zero": "must be a regular TOML file; got 'a character device'.",
    "deep_array": "must be nested at most 16 tables or arrays deep",
    "deep_table": "must be nested at most 16 tables or arrays deep",
    "empty": "must be at least one [section]",
    "ignored_factor_path": "`factor.path` must be left out when `factor.kind` = 'none'",
    "ignored_gauge_omega": "`gauge.omega` must be left out when `gauge.kind` = 'rope'",
    "ignored_solver_atol": "`solver.atol` must be left out when `solver.method` = 'rk4'",
    "ignored_solver_max_steps": "`solver.max_steps` must be left out when `solver.method` = 'rk4'",
    "int64_block_size": "`solver.block_size` must be an integer at most 2**63 - 1",
    "int64_token_stride": "`storage.token_stride` must be an integer at most 2**63 - 1",
    "adaptive_t_end": "`solver.save_every` must be at least `solver.t_end` / 1e+08",
}


@pytest.mark.parametrize("case", sorted(EDGE_CASES))
def test_an_edge_case_config_is_refused_in_one_line_within_seconds_writing_nothing(tmp_path, case):
    config, out = _edge_config(tmp_path, case), tmp_path / "run"
    before = sorted(p.name for p in tmp_path.iterdir())
    start = time.perf_counter()
    result = CliRunner().invoke(app, ["run", config, "--out", str(out)])
    elapsed = time.perf_counter() - start
    assert result.exit_code == 2, (case, result.output, result.exception)
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {config}: "), (case, result.output)
    assert EDGE_CASES[case] in lines[0], (case, lines[0])
    assert elapsed < 5.0, (case, elapsed)  # the acceptance bound; in-process it is milliseconds
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, --out included


# option strings at the edges, as the installed program gets them ({config}: a valid config file)
OPTION_CASES = {
    "continue": (
        ["landscape", "{config}", "--continue", "model.beta=0:1e9:1e-9"],  # was a MemoryError (6.94 EiB)
        "`--continue` must be at most 10000 values",
    ),
    "only": (["reproduce", "--only", "E1,,E2"], "`--only` must be a comma-separated list"),  # ran
}


@pytest.mark.parametrize(
    "case",
    ["fifo", "dev_zero", "deep_array", "empty", "ignored_factor_path", "int64_block_size", *OPTION_CASES],
)
def test_the_program_refuses_an_edge_case_within_5_s_and_200_mb(tmp_path, case):
    """The installed program (a process of its own): exit 2, one line, within 5 s and 200 MB."""
    config, out = _edge_config(tmp_path, case), tmp_path / "run"
    args, expected = ["run", config], EDGE_CASES.get(case)
    if case in OPTION_CASES:
        (tmp_path / "base.toml").write_text(toml_text(BASE))
        args, expected = OPTION_CASES[case]
        args = [arg.format(config=tmp_path / "base.toml") for arg in args]
    code = (
        "import json, resource, subprocess, sys, time\n"
        "start = time.perf_counter()\n"
        "done = subprocess.run([sys.executable, '-m', 'attnflow', *sys.argv[1:]], capture_output=True,"
        " text=True, timeout=60)\n"
        "seconds = time.perf_counter() - start\n"
        "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
        "print(json.dumps([done.returncode, seconds, peak, done.stderr]))\n"
    )
    probe = subprocess.run(
        [sys.executable, "-c", code, *args, "--out", str(out)], capture_output=True, text=True, timeout=90
    )
    returncode, seconds, peak_kib, stderr = json.loads(probe.stdout)
    assert returncode == 2, probe.stdout
    assert len(stderr.splitlines()) == 1 and stderr.startswith("error: ") and expected in stderr, stderr
    assert seconds < 5.0, seconds  # measured 0.7 s (the config is read before JAX is imported)
    assert peak_kib < 200 * 1024, peak_kib  # measured 50 MB
    assert not out.exists()
