"""Every kind of figure attnflow draws, on small data, has no clipped or overlapping text, no label
on another panel, and a key for each colour mapping (bounding boxes from matplotlib's renderer:
tests/figure_layout.py). Sizes cover d = 2 ... 128, labels up to 10^6 and 1 ... 16 panels."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from attnflow.viz import plotting
from attnflow.viz.colours import LABEL_CMAP, LABEL_STOPS, label_scale
from figure_layout import capture_figures, layout_problems

T = 4


def _unit(shape, seed=0):
    g = np.random.default_rng(seed).standard_normal(shape)
    return g / np.linalg.norm(g, axis=-1, keepdims=True)


def _series(ts):
    return {
        "energy": 1.0 - np.exp(-ts),
        "mean_cosine": 1.0 - 0.9 * np.exp(-ts),
        "gauge_mean_cosine": 1.0 - 0.8 * np.exp(-ts),
        "n_eff": np.linspace(40, 1, ts.size),
    }


def _assert_clean(saved):
    assert saved, "no figure was saved"
    problems = [p for _, found in saved for p in found]
    assert problems == []


# --------------------------------------------------------------------------- the checker can fail


def _bad_figure() -> Figure:
    """Two panels whose colour bar's label sits over the next panel, as states.png had."""
    fig = Figure(figsize=(6, 3))
    FigureCanvasAgg(fig)
    fig.subplots_adjust(left=0.0, right=1.0, wspace=0.02)
    a, b = fig.subplots(1, 2)
    dots = a.scatter([0, 1], [0, 1], c=[0, 1000])
    bar = fig.colorbar(dots, ax=a, fraction=0.05, pad=0.02)
    bar.set_label("label ξ")
    b.set_ylabel("PC 2")
    b.scatter([0, 1], [0, 1], c=[0, 5])  # coloured by values, no key
    fig.canvas.draw()
    return fig


def test_the_checker_finds_clipped_overlapping_and_unkeyed_figures():
    problems = layout_problems(_bad_figure())
    kinds = {p.split(":")[0] for p in problems}
    assert {"clipped", "on another panel", "no key"} <= kinds, problems


def test_the_checker_passes_a_figure_laid_out_by_constrained_layout():
    fig = Figure(figsize=(6, 3), layout="constrained")
    FigureCanvasAgg(fig)
    a, b = fig.subplots(1, 2)
    fig.colorbar(a.scatter([0, 1], [0, 1], c=[0, 1000]), ax=a, label="label ξ")
    b.plot([0, 1], [0, 1e-40])
    b.set(yscale="log", ylabel="gap")
    fig.canvas.draw()
    assert layout_problems(fig) == []


# --------------------------------------------------------------------------- plotting.py


@pytest.mark.parametrize(
    ("d", "n", "gauge"), [(2, 16, False), (3, 64, True), (5, 40, True), (64, 200, True), (128, 30, False)]
)
def test_run_figures_hold_their_layout(tmp_path, monkeypatch, d, n, gauge):
    ts = np.linspace(0.0, 10.0, T)
    xs = _unit((T, n, d))
    color = np.linspace(0.0, 1e6 if d == 128 else n - 1, n)  # long tick labels at d = 128
    with capture_figures(monkeypatch) as saved:
        plotting.write_run_figures(
            tmp_path, ts=ts, xs=xs, us=xs if gauge else None, color=color, series=_series(ts),
            title="examples/rope.toml, seed 0", energy_max=1.0,
        )  # fmt: skip
    assert len(saved) == 3
    _assert_clean(saved)


@pytest.mark.parametrize(("count", "d"), [(1, 3), (4, 3), (7, 5), (16, 3), (16, 64)])
def test_comparison_grids_of_1_to_16_panels_hold_their_layout(tmp_path, monkeypatch, count, d):
    n = 30
    panels = [
        {
            "x": _unit((n, d), seed=k),
            "color": np.arange(n, dtype=float),
            "title": f"E{k}: a setting, n={n}, seed 0\ncontent, τ = 20",
            "color_label": "position i" if k % 4 == 3 or k == count - 1 else None,
        }
        for k in range(count)
    ]
    with capture_figures(monkeypatch) as saved:
        plotting.write_comparison_figure(tmp_path / "c.png", panels, ncols=min(count, 4))
    _assert_clean(saved)


@pytest.mark.parametrize("d", [3, 4])
def test_long_panel_titles_wrap_within_their_panel(tmp_path, monkeypatch, d):
    """The reproduce report's titles name a variant and its expected shape: up to 60 characters
    on a line (E15 (h) of the report), wider than a panel of the grid at 8 pt."""
    n, long = 16, "E15 (h) RoPE, nGPT, alpha = 2: Dirac (in the gauge frame)"
    panels = [
        {
            "x": _unit((n, d if k % 2 else 3), seed=k),
            "color": np.arange(n, dtype=float),
            "title": f"{long[: 40 + 5 * k]}\nn={n}, content, τ = 8",
            "color_label": "position i" if k == 3 else None,
        }
        for k in range(5)
    ]
    with capture_figures(monkeypatch) as saved:
        plotting.write_comparison_figure(tmp_path / "c.png", panels, ncols=4)
    _assert_clean(saved)
    ((fig, _),) = saved
    titles = [t.get_text() for ax in fig.axes for t in ax.texts if t.get_text().startswith("E15")]
    # wrapped between words: every word kept, in order
    assert [" ".join(t.split()) for t in titles] == [" ".join(p["title"].split()) for p in panels]
    assert max(t.count("\n") for t in titles) >= 2


@pytest.mark.parametrize("groups", [1, 6, 16])
def test_series_panels_on_log_axes_hold_their_layout(tmp_path, monkeypatch, groups):
    ts = np.linspace(0.0, 10.0, 20)
    curves = [
        (
            f"E{g}: (E_max − E)/E_max",
            [(f"E{g}-a, n=128", ts, 10.0 ** (-6 * ts * (g + 1))), ("b, n=256", ts, 10**-ts)],
        )
        for g in range(groups)
    ]
    with capture_figures(monkeypatch) as saved:
        plotting.write_series_panels(tmp_path / "e.png", curves, ylabel="(E_max − E)/E_max", logy=True)
        plotting.write_series_figure(tmp_path / "s.png", curves[0][1], ylabel="mean cosine", title="E0")
    _assert_clean(saved)


def test_a_legend_in_a_right_corner_ends_at_its_panel_s_frame(tmp_path, monkeypatch):
    """Curves through both left corners put the legend top right: its long labels (those of the
    report's E14) end inside the panel, not over the next panel's tick labels."""
    ts = np.linspace(0.0, 10.0, 20)
    rise_and_fall = 10.0 ** np.interp(ts, [0.0, 2.5, 5.0, 10.0], [-10.0, 0.0, -5.0, -5.0])
    labels = ["E14 (c) rescaled clock c = e^-beta, beta = 2, n=4", "E14 (d) sa, beta = 1, n=4"]
    curves = [(label, ts, rise_and_fall * (1 + k)) for k, label in enumerate(labels)]
    with capture_figures(monkeypatch) as saved:
        plotting.write_series_panels(tmp_path / "e.png", [("E14: gap", curves)] * 3, ylabel="gap", logy=True)
    _assert_clean(saved)
    ((fig, _),) = saved
    (ax,) = fig.axes
    legend = [t for t in ax.texts if getattr(t, "panel_index", None) == 0]
    assert [t.get_text()[:14] for t in legend] == [label[:14] for label in labels]


@pytest.mark.parametrize("d", [3, 5])
def test_target_figures_hold_their_layout(tmp_path, monkeypatch, d):
    with capture_figures(monkeypatch) as saved:
        plotting.write_target_figure(tmp_path / "s.png", _unit((200, d)), _unit((200, d), 1), kind="sphere")
        angles = np.linspace(0, 6, 50)
        plotting.write_target_figure(tmp_path / "o.png", angles, angles + 0.1, kind="orbit")
    _assert_clean(saved)


# --------------------------------------------------------------------------- the movie, the other figures


def test_the_animation_frames_hold_their_layout_and_key_the_label(tmp_path, monkeypatch):
    from attnflow.viz.animation import write_animation
    from test_viewer import _stored  # a small stored run with a gauge

    stored = _stored(frames=6)
    with capture_figures(monkeypatch) as saved:
        write_animation(stored, tmp_path / "m.gif", title="runs/rope", max_frames=3)
    assert len(saved) >= 3
    _assert_clean(saved)
    fig = saved[0][0]
    assert all(
        c.cmap.name == LABEL_CMAP for ax in fig.axes for c in ax.collections if c.get_array() is not None
    )


def test_the_realisation_mode_figure_holds_its_layout(tmp_path, monkeypatch):
    from attnflow.viz.realisation import write_mode_figure

    rows = [
        {
            "mode": mode,
            "sigma": sigma,
            "n": n,
            "seed": s,
            "wasserstein": w * n**-0.5,
            "base_point_distance": w,
        }
        for mode, w in (("a-priori", 0.3), ("exact", 1e-15))
        for sigma in (0.5, 1.0)
        for n in (64, 256, 1024)
        for s in range(2)
    ]
    with capture_figures(monkeypatch) as saved:
        write_mode_figure(rows, tmp_path / "w1.png")
    _assert_clean(saved)


# --------------------------------------------------------------------------- one colour scheme


def test_the_label_has_one_colour_map_whose_stops_the_viewer_uses():
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    cmap = colormaps[LABEL_CMAP]
    assert list(LABEL_STOPS) == [to_hex(cmap(v)) for v in np.linspace(0.0, 1.0, len(LABEL_STOPS))]
    assert label_scale(np.array([3.0, 5.0, 4.0])).tolist() == [0.0, 1.0, 0.5]
    assert label_scale(np.array([2.0, 2.0])).tolist() == [0.0, 0.0]
    # both ends are dark enough to read on white (twilight's ends are near-white)
    for hex_colour in (LABEL_STOPS[0], LABEL_STOPS[-1]):
        rgb = [int(hex_colour[k : k + 2], 16) for k in (1, 3, 5)]
        assert min(rgb) < 60, hex_colour


@pytest.mark.parametrize("d", [3, 5])
def test_one_label_for_every_token_is_the_first_colour_with_or_without_a_colour_bar(d):
    from matplotlib import colormaps

    fig = Figure()
    FigureCanvasAgg(fig)
    x = _unit((6, d))
    plain = plotting.draw_state(fig, 121, x, color=np.zeros(6))
    keyed = plotting.draw_state(fig, 122, x, color=np.zeros(6), color_label="label ξ")
    fig.canvas.draw()
    first = np.asarray(colormaps[LABEL_CMAP](0.0))
    for ax in (plain, keyed):
        np.testing.assert_allclose(ax.collections[-1].get_facecolors()[0], first, atol=1e-6)


# ------------------------------------------------------------ the sweep, law and landscape figures


@pytest.mark.parametrize("metric", ["energy", "n_clusters>=2", "shape"])
def test_phase_diagrams_hold_their_layout(monkeypatch, metric):
    from attnflow.viz.phase import phase_figure

    rows = [
        {
            "model.beta": beta,
            "model.n": n,
            "energy": beta / n,
            "n_clusters": n // 8,
            "shape": "dirac" if n < 64 else "clusters",
        }
        for beta in (0.5, 1.0, 2.0, 4.0, 8.0)
        for n in (16, 64, 256, 1024)
    ]
    fig = phase_figure(rows, "model.beta", "model.n", metric, title="a sweep of 20 points")
    fig.canvas.draw()
    assert layout_problems(fig) == []


def test_the_law_figure_holds_its_layout(tmp_path, monkeypatch):
    from attnflow.viz.law import write_law_figure

    x = _unit((5000, 3))
    with capture_figures(monkeypatch) as saved:
        write_law_figure(tmp_path / "law.png", x=x, u=x[::-1], color=np.arange(5000), t=2.0, n_total=10**6)
    _assert_clean(saved)


def test_the_branch_and_threshold_figures_hold_their_layout(tmp_path, monkeypatch):
    from attnflow.viz.landscape import write_branch_figure
    from attnflow.viz.metastability import write_threshold_figure

    branches = [
        {
            "branch": b,
            "beta": beta,
            "energy": np.exp(beta) / (b + 2),
            "morse_index": int(beta > 2),
            "shape": "arc",
        }
        for b in range(3)
        for beta in np.linspace(0.5, 4.0, 8)
    ]
    threshold = [
        {
            "beta": beta,
            "k": 1,
            "kappa": kappa,
            "kappa_c_predicted": 2.0,
            "kappa_c_measured": 2.01,
            "rate_measured": 0.5 * (1 - 2.0 / kappa),
        }  # fmt: skip
        for beta in (1.0, 2.0)
        for kappa in (1.5, 2.0, 3.0, 4.0)
    ]
    with capture_figures(monkeypatch) as saved:
        write_branch_figure(branches, "beta", tmp_path / "b.png")
        write_threshold_figure(tmp_path / "k.png", threshold)
    _assert_clean(saved)


def test_the_lifetime_and_mean_field_figures_hold_their_layout(tmp_path, monkeypatch):
    from attnflow.analysis.plateaus import LifetimeFits, LineFit
    from attnflow.viz.mean_field import plot_laws
    from attnflow.viz.metastability import write_lifetime_figure
    from attnflow.workflows.mean_field import FinalLaw

    rows = [
        {
            "metastable": True,
            "n_clusters": c,
            "beta": beta,
            "lifetime": np.exp(beta * c / 4),
            "closest_angle": 0.8,
        }
        for c in (2, 3)
        for beta in (4.0, 6.0, 8.0)
    ]
    fit = LineFit(slope=0.5, intercept=0.1, slope_stderr=0.05, r2=0.98, points=3)
    laws = [
        FinalLaw(
            setting=s,
            n=n,
            xi=np.arange(n, dtype=float),
            x=_unit((n, 3), seed=n),
            status="ok",
            wall_s=1.0,
            cpu_s=1.0,
            accepted=10,
            evaluations=60,
        )  # fmt: skip
        for s in ("rope", "prompt")
        for n in (256, 1024)
    ]
    distances = [{"setting": s, "n": 256, "to_next": 0.05} for s in ("rope", "prompt")]
    with capture_figures(monkeypatch) as saved:
        write_lifetime_figure(tmp_path / "t.png", rows, LifetimeFits(beta=fit, barrier=fit, clusters=2))
        plot_laws(laws, distances, tmp_path / "m.png")
    _assert_clean(saved)


def test_the_collapse_plot_of_a_million_tokens_holds_its_layout(tmp_path, monkeypatch):
    ts = np.linspace(0.0, 10.0, T)
    series = {**_series(ts), "n_eff": np.linspace(999_999, 1, T), "energy": 1e6 * (1.0 - np.exp(-ts))}
    with capture_figures(monkeypatch) as saved:
        plotting.write_run_figures(tmp_path, ts=ts, xs=_unit((T, 30, 3)), us=None, color=None, series=series)
    _assert_clean(saved)


def test_the_context_study_figure_holds_its_layout(tmp_path, monkeypatch):
    from attnflow.viz.context_study import plot_context_study
    from attnflow.workflows.context_study import ContextRun

    sizes, ts = (128, 1024, 131_072), np.linspace(0.0, 20.0, 41)
    runs, rows = [], []
    for values in ("plain", "rotated"):
        for scaling in ("none", "preset"):
            for n in sizes:
                gap = np.exp(-ts * (1 + np.log2(n) / 20))
                runs.append(ContextRun(
                    values=values, scaling=scaling, n=n, seed=0, t_end=20.0, dt=0.05, ts=ts,
                    mean_cosine=1 - gap, gauge_mean_cosine=1 - 0.5 * gap, orbit_residual=gap,
                    spread=0.3 / np.log2(n), u_star=np.array([0.0, 0.0, 1.0]), status="ok", steps=400,
                    wall_s=1.0, cpu_s=1.0,
                ))  # fmt: skip
                rows.append({"values": values, "scaling": scaling, "n": n, "spread": 0.3 / np.log2(n),
                             "orbit_residual": 1e-9 * n, "collapse_x": None if n > 1024 else 12.5,
                             "collapse_u": 3.0 + np.log2(n)})  # fmt: skip
    typical = {scaling: [(n, 0.4 / np.log2(n)) for n in sizes] for scaling in ("none", "preset")}
    with capture_figures(monkeypatch) as saved:
        plot_context_study(runs, rows, typical, tmp_path / "context_study.png")
    _assert_clean(saved)
