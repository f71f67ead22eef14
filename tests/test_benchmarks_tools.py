"""The benchmark's pure helpers (``benchmarks/work.py``, ``benchmarks/references.py``): the work counted
per evaluation path, its limit, the JSON writer, and the blocked NumPy reference."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import references  # noqa: E402
import work  # noqa: E402


@pytest.mark.parametrize("n, block", [(4096, 128), (1000, 128), (129, 128), (65536, 128)])
def test_tiles_count_every_pair_once_padding_included(n, block):
    m = math.ceil(n / block)
    w = work.evaluation_work(n, 3, path="tiles", block=block, dv=4)
    assert w.items == m * (m + 1) // 2
    assert w.exps == m * (m + 1) // 2 * block**2
    # each pair: logits (d), C v and Cᵀ v (dv each), 2 flops per multiply-add
    assert w.flops == w.items * 2 * block**2 * (3 + 2 * 4)


def test_tiles_do_about_half_the_exponentials_of_dense():
    dense = work.evaluation_work(4096, 3, path="dense", block=None, dv=4)
    tiles = work.evaluation_work(4096, 3, path="tiles", block=128, dv=4)
    assert dense.exps == 4096**2
    assert tiles.exps / dense.exps == pytest.approx(33 / 64)  # m(m+1)/2 / m² with m = 32


def test_unrolled_diagonal_tiles_skip_the_transposed_product():
    tiles = work.evaluation_work(256, 3, path="tiles", block=128, dv=4)
    unrolled = work.evaluation_work(256, 3, path="unrolled tiles", block=128, dv=4)
    assert unrolled.exps == tiles.exps == 3 * 128**2
    assert tiles.flops - unrolled.flops == 2 * (2 * 128**2 * 4)  # two diagonal tiles, no Cᵀ v


def test_rows_count_padding_rows():
    w = work.evaluation_work(1000, 3, path="rows", block=256, dv=4)
    assert w.items == 1024
    assert w.exps == 1024 * 1000
    assert w.flops == 2 * 1024 * 1000 * (3 + 4)


def test_limit_is_exps_over_exp_rate_plus_flops_over_matmul_rate():
    w = work.Work(exps=10**9, flops=4 * 10**9, items=1)
    assert work.limit_s(w, exp_rate=1e9, matmul_rate=2e9) == pytest.approx(3.0)


def test_evaluation_work_rejects_unknown_paths():
    with pytest.raises(ValueError, match=r"evaluation_work: `path` must be one of .*; got 'diagonal'\."):
        work.evaluation_work(10, 3, path="diagonal", block=None, dv=4)


def test_padded_columns():
    assert [work.padded_columns(d, 4) for d in (1, 3, 4, 5, 64)] == [4, 4, 4, 8, 64]


def test_json_writer_turns_non_finite_numbers_into_null():
    text = work.dumps({"a": float("inf"), 2: [float("nan"), 1.5], "b": (np.float64(2.0), np.int64(3))})
    assert json.loads(text) == {"a": None, "2": [None, 1.5], "b": [2.0, 3]}
    assert "Infinity" not in text and "NaN" not in text


def test_json_writer_rejects_what_json_cannot_hold():
    with pytest.raises(TypeError):
        work.dumps({"a": object()})


def test_ratio_is_none_where_a_side_is_missing_or_not_finite():
    assert work.ratio(6.0, 2.0) == 3.0
    assert [work.ratio(*p) for p in ((None, 1.0), (1.0, 0.0), (float("inf"), 1.0), (1.0, float("nan")))] == [
        None
    ] * 4


@pytest.mark.parametrize(
    "path, block", [("dense", None), ("rows", 64), ("tiles", 64), ("unrolled tiles", 64)]
)
def test_blocked_reference_equals_the_naive_one(path, block):
    x = references.initial(150, 3, seed=1)
    # the sums are regrouped and exp(β(s−1))·e^β replaces exp(βs): equal to round-off
    np.testing.assert_allclose(
        references.blocked_field(x, path=path, block=block), references.naive_field(x), atol=1e-14
    )


@pytest.mark.slow
def test_gpu_script_runs_on_the_cpu_and_records_both_paths(tmp_path):
    """``benchmarks/gpu.py`` is meant for a GPU machine; the same code on the CPU at a small n keeps it
    working: both paths timed, their steps agree to the tolerance's order."""
    import gpu  # noqa: PLC0415 (the script sets jax's x64 flag at import, as the package does)

    result = gpu.main(
        ["--device", "cpu", "--sizes", "512", "--repeats", "1", "--dtypes", "float64", "float32",
         "--heads", "2", "--head-dims", "4", "--heads-n", "64", "--out", str(tmp_path / "g.json")]
    )  # fmt: skip
    assert json.loads((tmp_path / "g.json").read_text()) == result
    row64, row32 = result["paths"]
    assert (row64["n"], row64["dtype"], row32["dtype"]) == (512, "float64", "float32") and row64["rank"] > 1
    assert row64["exact_rk4_s"] > 0 and row64["expansion_rk4_s"] > 0
    assert row64["rk4_difference"] < 1e-9  # the expansion's tolerance is 1e-8 of the field's scale
    assert row32["rk4_difference"] < 1e-5  # float32 round-off of both paths
    shapes = [(h["head_dim"], h["d"], h["dtype"]) for h in result["heads"]]
    assert shapes == [(4, 8, "float64"), (4, 8, "float32")]
    assert all(h["field_s"] > 0 for h in result["heads"]) and "cpu" not in result  # the CPU alone


def test_report_rewrite_keeps_the_other_scripts_sections(tmp_path):
    path = tmp_path / "RESULTS.md"
    work.write_report(path, "# first\n")
    assert path.read_text() == "# first\n\n" + work.OTHER_SCRIPTS + "\n"
    path.write_text(path.read_text() + "## Expansion\nrow\n")
    work.write_report(path, "# second\n")
    assert path.read_text() == "# second\n\n" + work.OTHER_SCRIPTS + "\n## Expansion\nrow\n"
