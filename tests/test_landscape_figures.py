"""viz.landscape (the D3 branch diagram of several landscape folders) and viz.realisation (the modes).

The folders are synthetic: written here in the format of ``attnflow landscape --continue`` with
known branches, so the reduction (which state is which branch, beta_c, where the arc begins, the
energies at beta = 3) is checked against numbers put in by hand.
"""

import json

import numpy as np
import pytest

from attnflow.viz import landscape as figures
from attnflow.viz import realisation as mode_figures

STATES = [  # state, energy, index, shape at the config's beta = 3
    (0, 0.76, 0, "arc"),
    (1, 0.74, 1, "antipodal_arcs"),  # unstable: the stable one below is the branch drawn
    (2, 0.73, 0, "antipodal_arcs"),
    (3, 0.66, 9, "great_circle"),
    (4, 0.0, 4, "dirac"),
]


def write_folder(folder, n, beta_c):
    folder.mkdir()
    key = "model.beta"
    (folder / "landscape.json").write_text(
        json.dumps(
            {"config": {"model": {"n": n, "beta": 3.0}}, "continuation": {"key": key, "values": [1.0, 4.0]}}
        )
    )
    lines = ["state,energy,morse_index,shape,gradient_norm"]
    lines += [f"{s},{e!r},{i},{shape},1e-16" for s, e, i, shape in STATES]
    (folder / "states.csv").write_text("\n".join(lines) + "\n")
    betas = np.round(np.arange(1.0, 4.01, 0.5), 12).tolist()
    rows = [f"branch,{key},energy,morse_index,lambda_1,gradient_norm,shape"]
    for b in betas:  # the great circle: stable below beta_c
        rows.append(f"3,{b!r},{0.2 * b!r},{0 if b < beta_c else 1},0.0,1e-16,great_circle")
    for b in [b for b in betas if b >= 2.0]:  # the single arc from 1.8 on, stable
        rows.append(f"0,{b!r},{0.25 * b + 0.01!r},0,-0.1,1e-16,arc")
    for b in betas:  # both antipodal arcs everywhere
        rows.append(f"1,{b!r},{0.24 * b!r},1,0.1,1e-16,antipodal_arcs")
        rows.append(f"2,{b!r},{0.23 * b!r},0,-0.1,1e-16,antipodal_arcs")
    (folder / "branches.csv").write_text("\n".join(rows) + "\n")
    (folder / "transitions.csv").write_text(
        f"branch,{key},kind,index_below,index_above,eigenvalue\n"
        f"0,1.8,end,,0,\n3,{beta_c!r},index,0,1,1\n3,3.7,index,1,3,2\n"
    )
    return folder


def test_d3_branch_figure_and_table_from_synthetic_folders(tmp_path):
    folders = [write_folder(tmp_path / "b", 128, 1.55), write_folder(tmp_path / "a", 64, 1.6)]
    path = figures.write_d3_branches(folders, tmp_path / "fig" / "d3.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    data = figures.read_branch_folder(folders[0])
    assert {label: b["state"] for label, b in data["branches"].items()} == {
        "single arc": 0,
        "antipodal arcs": 2,  # the stable one, not the higher saddle
        "great circle": 3,
    }
    assert data["beta_c"] == 1.55 and data["arc_from"] == 1.8 and data["n"] == 128
    table = figures.branch_summary(folders, at=3.0)
    assert [row["n"] for row in table] == [128, 64]  # in the folders' order
    row = table[1]
    assert row["beta_c"] == 1.6 and row["arc_from"] == 1.8
    assert row["arc_over_circle"] == 2.0  # the arc is above the circle from its first point
    assert row["energy single arc"] == pytest.approx(0.76)  # 0.25·3 + 0.01
    assert row["energy antipodal arcs"] == pytest.approx(0.69) and row["index antipodal arcs"] == 0
    assert row["energy great circle"] == pytest.approx(0.6) and row["index great circle"] == 1
    below = {"p": np.array([1.0, 2.0, 3.0]), "energy": np.array([0.1, 0.2, 0.5])}
    circle = {"p": np.array([1.0, 3.0]), "energy": np.array([0.2, 0.4])}
    assert figures._crossing(below, circle) == pytest.approx(2.5)  # gap -0.1, -0.1, +0.1: zero at 2.5
    off_grid = figures.branch_summary(folders[:1], at=3.2)[0]
    assert np.isnan(off_grid["energy single arc"]) and off_grid["index single arc"] == -1


def test_mode_figure_and_table(tmp_path):
    rows = [
        {"mode": mode, "n": n, "sigma": 0.2, "seed": seed, "base_point_distance": w, "wasserstein": w}
        for mode, scale in (("a-priori", 1e-2), ("exact", 1e-15))
        for n in (32, 64)
        for seed, w in enumerate((scale, 3 * scale))
    ]
    path = mode_figures.write_mode_figure(rows, tmp_path / "w1.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = mode_figures.mode_table(rows).splitlines()
    assert table[0] == "| mode | sigma | n = 32: ‖u* − v0‖ / W1 | n = 64: ‖u* − v0‖ / W1 |"
    assert table[2] == "| a-priori | 0.2 | 2.0e-02 / 2.0e-02 | 2.0e-02 / 2.0e-02 |"  # medians of 1e-2, 3e-2
    assert table[3] == "| exact | 0.2 | 2.0e-15 / 2.0e-15 | 2.0e-15 / 2.0e-15 |"
