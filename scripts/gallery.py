"""Regenerate the examples gallery: run every ``examples/gallery/*.toml`` with ``attnflow run`` (as a
user would), copy its state figure to ``docs/gallery/NAME.png`` and write ``docs/gallery.md``.

    python scripts/gallery.py            # all examples, a few minutes on 2 cores
    python scripts/gallery.py rope noise # some of them (the page lists every example either way)
    python scripts/gallery.py --page     # only the page, from docs/gallery/results.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "gallery"
FIGURES = ROOT / "docs" / "gallery"
PAGE = ROOT / "docs" / "gallery.md"

INTRO = """# Examples gallery

One runnable config per gauge, factor, normalisation and profile, in `examples/gallery/`. Each
ran with `attnflow run examples/gallery/NAME.toml --out runs/NAME` (64 or 128 tokens on S², a few
seconds each); the figure is the run's `figures/states.png`: the tokens at the start and at the
end, in the content (top) and, with a gauge, in the gauge frame (bottom), coloured by the label.
`python scripts/gallery.py` runs them all again and rewrites this page.

The shape classes are those of `attnflow.analysis.shapes` (dirac, great circle, arc, antipodal arcs,
small circle; "clusters" is everything else, a curve included). The cluster count joins tokens closer
than 0.1 rad in chains, so a circle or a curve of close tokens counts as one cluster: read it with
the shape class and the mean cosine (about 0 for tokens spread evenly, 1 for one point).
"""


def description(config: Path) -> str:
    """The leading comment lines of a config, joined."""
    lines = []
    for line in config.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").rstrip())
    return " ".join(lines)


def final_shape(run_dir: Path) -> str:
    from attnflow.analysis.shapes import classify_shape
    from attnflow.io.store import read_trajectory

    xs = read_trajectory(run_dir / "trajectory.zarr").xs
    return classify_shape(np.asarray(xs[-1])) if xs.shape[-1] == 3 else "n/a (d != 3)"


def section(config: Path, entry: dict | None) -> str:
    name = config.stem
    text = [
        f"## {name}",
        "",
        description(config),
        "",
        f"```bash\nattnflow run examples/gallery/{name}.toml\n```",
        "",
    ]
    if entry is not None:
        orbit = entry.get("gauge_mean_cosine") is not None and entry["gauge_mean_cosine"] >= 0.999
        text += [
            f"At the end (status `{entry['status']}`): shape class **{entry['shape']}**, mean cosine "
            f"{entry['mean_cosine']:.3f}, {entry['n_clusters']} cluster(s) at 0.1 rad"
            + (
                f"; gauge-frame mean cosine {entry['gauge_mean_cosine']:.4f}: the gauge frame is one point, "
                "so the tokens lie on the orbit of that point under the labels' rotations."
                if orbit and "[gauge]" in config.read_text()
                else "."
            ),
            "",
        ]
    if (FIGURES / f"{name}.png").exists():
        text += [f"![{name}: tokens at the start and at the end](gallery/{name}.png)", ""]
    return "\n".join(text)


def main(names: list[str]) -> None:
    configs = sorted(EXAMPLES.glob("*.toml"))
    page_only = names == ["--page"]
    chosen = [] if page_only else [c for c in configs if not names or c.stem in names]
    FIGURES.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for config in chosen:
            out = Path(scratch) / config.stem
            subprocess.run(
                [sys.executable, "-m", "attnflow", "run", str(config), "--out", str(out)], check=True
            )
            with Image.open(out / "figures" / "states.png") as image:  # 256 colours: a third of the size
                image.convert("RGB").quantize(256).save(FIGURES / f"{config.stem}.png", optimize=True)
            metrics = json.loads((out / "metrics.json").read_text())
            results[config.stem] = {
                "shape": final_shape(out),
                "mean_cosine": metrics["mean_cosine"],
                "n_clusters": metrics["n_clusters"],
                "gauge_mean_cosine": metrics["gauge_mean_cosine"],
                "status": metrics["run"]["status"],
            }
            print(f"{config.stem}: {results[config.stem]}", flush=True)
    old = json.loads((FIGURES / "results.json").read_text()) if (FIGURES / "results.json").exists() else {}
    merged = {**old, **results}
    (FIGURES / "results.json").write_text(json.dumps(merged, indent=1) + "\n")
    parts = [INTRO]
    for config in configs:
        parts.append(section(config, merged.get(config.stem)))
    PAGE.write_text("\n".join(parts))
    print(f"written {PAGE}")


if __name__ == "__main__":
    main(sys.argv[1:])
