"""``benchmarks/layer.py`` (a Llama-3-like head per RK4 step against NumPy, the layer norms against
post-LN) at its quick size: the two RK4s agree to float32 round-off, every norm is timed, and the
section it writes into a RESULTS file names every norm."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_layer_benchmark_quick_runs_agree_and_render(tmp_path):
    out = tmp_path / "layer.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "layer.py"), "--quick", "--out", str(out)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    result = json.loads(out.read_text())
    head = result["head"]
    assert (head["n"], head["d"], head["steps"]) == (1024, 128, 2)
    assert head["max_abs_difference"] < 1e-5  # the same RK4 steps, float32 round-off apart
    assert head["attnflow_cpu_s"] > 0 and head["numpy_cpu_s"] > 0 and 0 < head["limit_over_cpu"]
    assert [r["norm"] for r in result["norms"]] == ["post", "pre", "peri", "ngpt"]
    assert result["norms"][0]["over_post_cpu"] == 1.0 and all(r["step_cpu_s"] > 0 for r in result["norms"])
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import layer  # noqa: PLC0415

    results_md = tmp_path / "RESULTS.md"
    results_md.write_text("# Results\n\n<!-- other: begin -->\nkept\n<!-- other: end -->\n")
    layer.render(result, results_md)
    text = results_md.read_text()
    assert "kept" in text and text.count(layer.BEGIN) == 1
    assert all(f"| {norm} |" in text for norm in ("post", "pre", "peri", "ngpt"))
