"""Paper-ready figures of attnflow.viz.plotting: colour bars that name the colour, titles, the E_max
line, distinct colours, per-panel horizons, the target density, and vector output on request."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest
from matplotlib.figure import Figure

from attnflow.viz import figure_files
from attnflow.viz.plotting import (
    draw_state,
    figure_formats,
    write_run_figures,
    write_series_figure,
    write_series_panels,
    write_target_figure,
)

N, T = 30, 5


def _unit(shape, seed=0):
    g = np.random.default_rng(seed).standard_normal(shape)
    return g / np.linalg.norm(g, axis=-1, keepdims=True)


def _colour_bar_labels(fig: Figure) -> list[str]:
    # a colour bar is an extra Axes whose (y) label is the name given; a grid's colour key is an
    # image of gid "colour key" with its name the rotated text beside it
    bars = [a.get_ylabel() for a in fig.axes if a.get_label() == "<colorbar>"]
    keys = [t.get_text() for a in fig.axes for t in a.texts if t.get_rotation() == 90]
    assert len(keys) == sum(m.get_gid() == "colour key" for a in fig.axes for m in a.images)
    return bars + keys


@pytest.mark.parametrize("d", [3, 5])
def test_a_coloured_scatter_has_a_colour_bar_naming_the_colour(d):
    fig = Figure()
    draw_state(fig, 111, _unit((N, d)), color=np.arange(N), color_label="position i")
    assert _colour_bar_labels(fig) == ["position i"]


def test_a_colour_bar_of_a_few_ids_has_one_tick_per_id():
    fig = Figure()
    draw_state(fig, 111, _unit((N, 3)), color=np.arange(N) % 4, color_label="prompt id")
    bar = next(a for a in fig.axes if a.get_label() == "<colorbar>")
    assert list(bar.get_yticks()) == [0.0, 1.0, 2.0, 3.0]


def test_no_colour_bar_without_a_name_or_without_colour():
    fig = Figure()
    draw_state(fig, 121, _unit((N, 3)), color=np.arange(N))
    draw_state(fig, 122, _unit((N, 3)), color_label="label ξ")
    assert _colour_bar_labels(fig) == []


def _captured(monkeypatch):
    figures = {}
    real = figure_files._save_png

    def spy(fig, path):
        figures[path.name] = fig
        return real(fig, path)

    monkeypatch.setattr(figure_files, "_save_png", spy)
    return figures


def test_run_figures_carry_colour_bars_title_and_the_e_max_line(tmp_path, monkeypatch):
    figures = _captured(monkeypatch)
    ts = np.linspace(0.0, 1.0, T)
    xs = _unit((T, N, 3))
    series = {"energy": 1.0 - np.exp(-ts), "mean_cosine": ts / 2}
    write_run_figures(
        tmp_path, ts=ts, xs=xs, us=xs, color=np.arange(N), series=series,
        color_label="prompt id", title="E3 (seed 0)", energy_max=1.0,
    )  # fmt: skip
    states = figures["states.png"]
    assert _colour_bar_labels(states) == ["prompt id"] * 2  # one per row: content, gauge frame
    titles = [a.get_title() for a in states.axes] + [t.get_text() for a in states.axes for t in a.texts]
    assert any(title.startswith("E3 (seed 0): ") for title in titles)
    ax = figures["energy.png"].axes[0]
    assert ax.get_title() == "E3 (seed 0): energy"
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["E_max (closed form)"].get_ydata()) == [1.0, 1.0]
    assert "E_max (closed form)" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_run_energy_plot_has_no_e_max_line_when_unknown(tmp_path, monkeypatch):
    figures = _captured(monkeypatch)
    ts = np.linspace(0.0, 1.0, T)
    write_run_figures(tmp_path, ts=ts, xs=_unit((T, N, 3)), us=None, color=None, series={"energy": ts})
    assert [line.get_label() for line in figures["energy.png"].axes[0].get_lines()] == ["E(t)"]


def test_every_curve_of_a_shared_plot_has_its_own_colour(tmp_path, monkeypatch):
    figures = _captured(monkeypatch)
    ts = np.linspace(0.0, 1.0, T)
    curves = [(f"E{k}", ts, ts * k) for k in range(13)]  # more than the ten default colours
    write_series_figure(tmp_path / "s.png", curves, ylabel="y")
    colours = [tuple(line.get_color()) for line in figures["s.png"].axes[0].get_lines()]
    assert len(colours) == 13 and len(set(colours)) == 13


def test_series_panels_end_at_each_groups_own_horizon(tmp_path, monkeypatch):
    figures = _captured(monkeypatch)
    short, long = np.linspace(0.0, 20.0, 11), np.linspace(0.0, 100.0, 11)
    groups = [("E1", [("a", short, short)]), ("E5", [("b", long, long), ("c", long, -long)])]
    write_series_panels(tmp_path / "p.png", groups, ylabel="y")
    (ax,) = figures["p.png"].axes  # every panel on one Axes (inches), each with its own limits
    assert ax.panel_limits == [(0.0, 20.0), (0.0, 100.0)]
    texts = [t.get_text() for t in ax.texts]
    assert "E1 (a)" in texts and "E5" in texts  # one curve: named in the title, no legend
    assert "a" not in texts and {"b", "c"} <= set(texts)  # two curves: a legend
    curves = {line.get_label(): line for line in ax.get_lines() if line.get_label() in ("a", "b", "c")}
    assert len({tuple(curves[k].get_color()) for k in "bc"}) == 2
    # each panel's x-axis ends at its own last time: its curve's last point on its box's right edge
    for (left, _, width, _), name in zip(ax.panel_boxes, "ab", strict=True):
        right_edge = (left + width) * ax.get_xlim()[1]
        assert curves[name].get_xdata()[-1] == pytest.approx(right_edge)
        assert curves[name].get_xdata()[0] == pytest.approx(left * ax.get_xlim()[1])  # t = 0 on the left


def test_orbit_target_figure_overlays_the_target_density(tmp_path, monkeypatch):
    figures = _captured(monkeypatch)
    rng = np.random.default_rng(0)
    grid = np.linspace(0.0, 2.0 * np.pi, 50)
    pdf = np.full_like(grid, 1.0 / (2.0 * np.pi))
    write_target_figure(tmp_path / "o.png", rng.uniform(0, 6, 40), rng.uniform(0, 6, 40), kind="orbit",
                        density=(grid, pdf))  # fmt: skip
    lines = {line.get_label(): line for line in figures["o.png"].axes[0].get_lines()}
    np.testing.assert_array_equal(lines["target density"].get_ydata(), pdf)
    with pytest.raises(ValueError, match=r"`density` must be a pair \(angles, pdf\)"):
        write_target_figure(tmp_path / "x.png", [1.0], [1.0], kind="orbit", density=(grid, pdf[:3]))


def test_vector_output_on_request_writes_parseable_svg_and_pdf(tmp_path, monkeypatch):
    ts = np.linspace(0.0, 1.0, T)
    path = write_series_figure(tmp_path / "s.png", [("a", ts, ts)], ylabel="y", formats=("svg", "pdf"))
    assert path == tmp_path / "s.png" and path.read_bytes()[:4] == b"\x89PNG"
    assert ET.parse(tmp_path / "s.svg").getroot().tag.endswith("svg")
    assert (tmp_path / "s.pdf").read_bytes()[:5] == b"%PDF-"
    monkeypatch.setenv("ATTNFLOW_FIGURE_FORMAT", "svg")
    write_series_figure(tmp_path / "env.png", [("a", ts, ts)], ylabel="y")
    assert (tmp_path / "env.svg").is_file() and not (tmp_path / "env.pdf").exists()


def test_figure_formats_validates():
    assert figure_formats(()) == ("png",)
    assert figure_formats(["SVG", ".pdf", "png"]) == ("png", "svg", "pdf")
    with pytest.raises(ValueError, match=r"`formats` must name formats .* got 'sgv'. Did you mean 'svg'\?"):
        figure_formats(["sgv"])
