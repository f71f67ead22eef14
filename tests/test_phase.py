"""attnflow.viz.phase: a cell of the phase diagram that no row reached says "n/a"."""

from __future__ import annotations

import pytest

from attnflow.viz.phase import phase_figure


@pytest.mark.parametrize("metric", ["energy", "n_clusters>=2", "shape"])
def test_blank_phase_cells_say_not_available(metric):
    # three of the four (beta, n) cells are measured; (beta = 2, n = 16) is not
    rows = [
        {"model.beta": 1.0, "model.n": 8, "energy": 0.5, "n_clusters": 1, "shape": "dirac"},
        {"model.beta": 2.0, "model.n": 8, "energy": 0.7, "n_clusters": 3, "shape": "clusters"},
        {"model.beta": 1.0, "model.n": 16, "energy": 0.6, "n_clusters": 2, "shape": "circle"},
    ]
    fig = phase_figure(rows, "model.beta", "model.n", metric)
    ax = fig.axes[0]
    blank = [t for t in ax.texts if t.get_text() == "n/a"]
    assert len(blank) == 1
    assert blank[0].get_position() == (1, 1)  # column beta = 2, row n = 16
