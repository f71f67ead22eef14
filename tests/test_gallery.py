"""The examples gallery: every config is valid and described, and the docs page shows each one."""

from pathlib import Path

import pytest

from attnflow.io.config import load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "examples" / "gallery").glob("*.toml"))
PAGE = ROOT / "docs" / "gallery.md"


def test_gallery_covers_every_gauge_factor_normalisation_and_profile():
    configs = [load_config(path) for path in CONFIGS]
    assert {c.gauge.kind for c in configs} >= {"none", "rope", "generalized_rope", "prompt"}
    assert {c.factor.kind for c in configs} >= {"none", "distance_bias", "toeplitz_cos"}
    assert {c.model.normalization for c in configs} == {"usa", "sa"}
    assert {c.model.profile for c in configs} == {"exp", "linear"}
    assert any(c.model.causal for c in configs) and any(c.model.noise > 0 for c in configs)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_each_example_is_described_and_shown(path):
    assert path.read_text().startswith("# "), "a config opens with what it shows"
    page = PAGE.read_text()
    assert f"## {path.stem}\n" in page and f"attnflow run examples/gallery/{path.stem}.toml" in page
    assert f"](gallery/{path.stem}.png)" in page
    assert (ROOT / "docs" / "gallery" / f"{path.stem}.png").stat().st_size > 10_000
