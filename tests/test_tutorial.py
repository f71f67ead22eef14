"""The tutorial (docs/tutorial.py) runs as a script, and its docs page is drawn from it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial.py"
sys.path.insert(0, str(ROOT / "docs"))

import hooks  # noqa: E402


def test_tutorial_page_turns_cells_into_text_and_code():
    page = hooks.tutorial_page("# ---\n# header\n# ---\n# %% [markdown]\n# # Title\n# text\n\n# %%\nx = 1\n")
    assert page.startswith("# Title\ntext")
    assert "```py\nx = 1\n```" in page and "header" not in page


@pytest.mark.slow
def test_tutorial_runs_and_draws_its_figure(tmp_path):
    env = {**os.environ, "TUTORIAL_OUT": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, str(TUTORIAL)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "status ok; mean cosine" in result.stdout and "n = 100000: ok" in result.stdout
    assert (tmp_path / "collapse_vs_rope.png").stat().st_size > 10_000
