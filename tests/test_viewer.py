"""The run viewer (self-contained HTML, tested in a real headless Chromium) and the animation."""

import base64
import dataclasses
import html
import json
import re
import shutil
import subprocess

import numpy as np
import pytest

from attnflow.io.store import (
    CorruptStoreError,
    StoredGauge,
    StoredTrajectory,
    TrajectoryWriter,
    read_trajectory,
    spread,
)
from attnflow.viz.animation import write_animation
from attnflow.viz.viewer import viewer_html, write_run_viewer, write_viewer

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")


def _stored(frames=30, n=48, d=3, gauge=True):
    """A latitude circle forming while the gauge frame collapses (a RoPE-like run, synthetic)."""
    ts = np.arange(frames) * 0.5
    angle = 2 * np.pi * np.arange(n) / n
    height = np.linspace(-0.8, 0.8, frames)[:, None] * np.ones(n)
    spread = np.linspace(1.0, 0.05, frames)[:, None]
    xs = np.stack([np.cos(angle * spread), np.sin(angle * spread), height], axis=-1)
    xs /= np.linalg.norm(xs, axis=-1, keepdims=True)
    rotations = None
    if gauge:
        c, s = np.cos(angle), np.sin(angle)
        rotations = np.zeros((n, 3, 3))
        rotations[:, 0, 0], rotations[:, 0, 1], rotations[:, 1, 0], rotations[:, 1, 1] = c, -s, s, c
        rotations[:, 2, 2] = 1.0
    return StoredTrajectory(
        ts=ts,
        xs=xs[..., :d],
        xi=np.arange(n, dtype=float),
        attrs={},
        status="ok",
        stored_gauge=None if rotations is None else StoredGauge(d=d, matrices=rotations),
    )


def _data(page: str) -> dict:
    return json.loads(
        re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S).group(1)
    )


@pytest.mark.parametrize(("count", "limit"), [(5, 10), (201, 101), (1000, 7), (2, 2)])
def test_spread_indices_keep_both_ends(count, limit):
    chosen = spread(count, limit)
    assert chosen[0] == 0 and chosen[-1] == count - 1
    assert len(chosen) == min(count, limit)
    assert np.all(np.diff(chosen) > 0)


def test_page_holds_the_positions_and_nothing_from_outside():
    run = _stored()
    page = viewer_html(run.ts, run.xs, run.xi, run.gauge_frame, title="t <run>")
    data = _data(page)
    positions = np.frombuffer(base64.b64decode(data["positions"]), dtype="<i2").reshape(2, 30, 48, 3) / 32767
    np.testing.assert_allclose(positions[0], run.xs, atol=1 / 32767)
    u = np.einsum("nij,tnj->tni", run.gauge, run.xs)
    np.testing.assert_allclose(positions[1], u, atol=1 / 32767)
    assert data["panels"] == ["content x", "gauge frame u = Q(ξ) x"]
    assert "t &lt;run&gt;" in page  # the title is escaped
    assert not re.search(r"https?://|src=", page)  # offline: no link, no loaded script


def test_page_of_a_circle_run_without_gauge_shows_one_panel_on_the_equator():
    run = _stored(d=2, gauge=False)
    data = _data(viewer_html(run.ts, run.xs, run.xi, None, title="circle"))
    positions = np.frombuffer(base64.b64decode(data["positions"]), dtype="<i2").reshape(1, 30, 48, 3)
    assert data["panels"] == ["content x"] and np.all(positions[..., 2] == 0)


@pytest.mark.parametrize("title", ["__DATA__", "runs/__LEGEND__ and __KEY__", "__TITLE__"])
def test_a_title_that_names_a_template_field_stays_a_title(title):
    run = _stored(frames=3, n=8)
    page = viewer_html(run.ts, run.xs, run.xi, None, title=title)
    heading = re.search(r"<title>(.*?)</title>", page, re.S).group(1)
    assert heading == title  # not the JSON data, the legend or the key pulled into the title
    assert page.count('"positions"') == 1  # the data once, in its script element
    assert _data(page)["panels"] == ["content x"]


def test_the_page_keys_the_label_with_the_colour_map_of_the_figures():
    from attnflow.viz.colours import LABEL_STOPS

    run = _stored(frames=3, n=8)
    page = viewer_html(run.ts, run.xs, run.xi, None, title="key")
    data = _data(page)
    assert data["stops"] == list(LABEL_STOPS)
    assert min(data["phase"]) == 0.0 and max(data["phase"]) == 1.0  # smallest label to largest
    assert "label ξ: 0" in page and ">7</span>" in page  # the key names both ends of the label's range
    assert "hsl" not in page  # no second colour scheme


def test_the_page_reads_out_each_panel_s_mean_cosine_per_frame_and_has_speed_and_keys():
    run = _stored()
    page = viewer_html(run.ts, run.xs, run.xi, run.gauge_frame, title="readout")
    data = _data(page)
    u = np.einsum("nij,tnj->tni", run.gauge, run.xs)
    for panel, states in enumerate((run.xs, u)):
        cosines = [np.mean(x @ x.T) for x in states]  # (1/n²) Σ_ij ⟨x_i, x_j⟩
        np.testing.assert_allclose(data["mean_cosine"][panel], cosines, atol=1e-4)  # rounded to 4 digits
    assert 'id="speed"' in page and '"ArrowRight"' in page and 'e.key === " "' in page


# Run in the page by Chromium after it has drawn: every pair of the page's boxes (title, setting
# line, each control, each canvas and caption, the colour key's parts, the legend) that overlap,
# and whether the page is wider than the window; then the same after a deliberate break (the
# setting line pulled up over the title), which the probe must see.
LAYOUT_PROBE = """<script>
function measure() {
  const boxes = [...document.querySelectorAll(
    "h3, .setting, .controls > *, canvas, figcaption, .key > *, .legend")]
    .map(el => [el.id || el.className || el.tagName.toLowerCase(), el.getBoundingClientRect()])
    .filter(([, r]) => r.width > 0 && r.height > 0);
  const overlaps = [];
  boxes.forEach(([a, p], i) => boxes.slice(i + 1).forEach(([b, q]) => {
    const w = Math.min(p.right, q.right) - Math.max(p.left, q.left);
    const h = Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top);
    if (w > 0.5 && h > 0.5) overlaps.push([a, b]);
  }));
  return {overlaps, wide: document.documentElement.scrollWidth > innerWidth};
}
const seen = measure();
document.querySelector(".setting").style.marginTop = "-30px";
const out = document.createElement("pre");
out.id = "probe";
out.textContent = JSON.stringify({...seen, broken: measure().overlaps});
document.body.append(out);
</script>"""


@pytest.mark.skipif(BROWSER is None, reason="no Chromium on this machine (CI installs one)")
@pytest.mark.parametrize("width", [1400, 820])
def test_the_read_out_follows_the_frame_and_nothing_overlaps_in_a_real_browser(tmp_path, width):
    config = {"model": {"n": 48, "d": 3, "beta": 1.0}, "aux": {"kind": "positions"},
              "gauge": {"kind": "rope", "frequencies": "full_period"},
              "solver": {"method": "rk4", "dt": 0.01}}  # fmt: skip
    run = dataclasses.replace(_stored(), attrs={"config": config})
    energy = np.linspace(0.2, 0.9, len(run.ts))
    page = write_viewer(run, tmp_path / "viewer.html", title="a run folder's name", energy=energy)
    page.write_text(page.read_text(encoding="utf-8").replace("</body>", LAYOUT_PROBE + "</body>"))
    dom = subprocess.run(
        [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
         f"--window-size={width},900", f"{page.as_uri()}#frame=-1"],
        check=True, capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    last = _data(page.read_text())["mean_cosine"][0][-1]
    assert f"mean cosine {last:.4f}" in dom
    assert re.search(r"t = 14\.5\s+\(snapshot 30 of 30\), energy E = 0\.900000", dom)
    assert "n = 48, d = 3, β = 1, gauge rope (full_period), labels positions, rk4 dt = 0.01" in dom
    layout = json.loads(html.unescape(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S).group(1)))
    assert layout["overlaps"] == [] and not layout["wide"], layout
    assert ["h3", "setting"] in layout["broken"], layout  # the probe sees an overlap


def test_fill_template_names_a_missing_field():
    from attnflow.viz.viewer import fill_template

    assert fill_template("a __X__ b __Y__", {"X": "__Y__", "Y": "1"}) == "a __Y__ b 1"
    with pytest.raises(ValueError, match=r"field `__Z__` must be given"):
        fill_template("__Z__", {"X": ""})


def _screenshot(page, frame, tmp_path):
    shot = tmp_path / f"shot{frame}.png"
    subprocess.run(
        [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / f'profile{frame}'}", "--window-size=900,560",
         f"--screenshot={shot}", f"{page.as_uri()}#frame={frame}"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    from matplotlib.image import imread

    return imread(shot)[:, :, :3]


@pytest.mark.skipif(BROWSER is None, reason="no Chromium on this machine (CI installs one)")
def test_viewer_draws_and_moves_with_the_slider_in_a_real_browser(tmp_path):
    run = _stored()
    page = write_viewer(run, tmp_path / "viewer.html", title="synthetic")
    first, last = _screenshot(page, 0, tmp_path), _screenshot(page, -1, tmp_path)
    canvas = (slice(90, 460), slice(15, 390))  # the first panel, below the controls
    # not blank: coloured points on white (a saturated pixel has channels far apart)
    saturation = first[canvas].max(axis=2) - first[canvas].min(axis=2)
    assert (saturation > 0.3).sum() > 100
    # the slider moved the picture: many pixels of the panels change between t = 0 and the end
    changed = np.abs(first[85:470] - last[85:470]).max(axis=2) > 0.2
    assert changed.sum() > 500


def test_animation_gif_has_one_frame_per_shown_snapshot(tmp_path):
    from PIL import Image

    path = write_animation(_stored(frames=6), tmp_path / "run.gif", title="synthetic", max_frames=4)
    with Image.open(path) as gif:
        assert gif.format == "GIF" and gif.n_frames == 4


def test_animation_refuses_an_unknown_format(tmp_path):
    with pytest.raises(
        ValueError, match=r"animate: `--out` must end in one of \['.gif', '.mp4'\]; got '.*run.avi'"
    ):
        write_animation(_stored(frames=3), tmp_path / "run.avi", title="x")
    assert not (tmp_path / "run.avi").exists()


def _run_folder(tmp_path, run):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    n = run.xs.shape[1]
    with TrajectoryWriter(
        run_dir / "trajectory.zarr", n_snapshots_max=len(run.ts), n=n, d=3, xi=run.xi, gauge=run.gauge
    ) as writer:
        for t, x in zip(run.ts, run.xs, strict=True):
            writer.append(t, x)
    return run_dir


def test_a_store_read_on_a_token_subsample_keeps_their_labels_and_gauge(tmp_path):
    run = _stored(frames=4, n=48)
    run_dir = _run_folder(tmp_path, run)
    kept = read_trajectory(run_dir / "trajectory.zarr", max_tokens=7)
    rows = spread(48, 7)
    assert rows.tolist() == [0, 8, 16, 24, 31, 39, 47]
    np.testing.assert_array_equal(kept.xs, run.xs[:, rows])
    few = read_trajectory(run_dir / "trajectory.zarr", max_tokens=7, snapshots=[1, 3])
    np.testing.assert_array_equal(few.xs, run.xs[[1, 3]][:, rows])
    np.testing.assert_array_equal(few.ts, run.ts[[1, 3]])
    with pytest.raises(CorruptStoreError, match=r"store: snapshot 4 must be complete to be read"):
        read_trajectory(run_dir / "trajectory.zarr", snapshots=[4])  # a store of four snapshots
    np.testing.assert_array_equal(kept.xi, run.xi[rows])
    np.testing.assert_array_equal(kept.gauge_frame(kept.xs), run.gauge_frame(run.xs)[:, rows])


def test_the_run_viewer_says_how_many_tokens_of_the_run_it_shows(tmp_path, monkeypatch):
    from attnflow.viz import viewer

    monkeypatch.setattr(viewer, "MAX_TOKENS", 10)
    run_dir = _run_folder(tmp_path, _stored(frames=4, n=48))
    monkeypatch.setattr(viewer, "MAX_FRAMES", 3)
    page = write_run_viewer(run_dir, n_snapshots=4).read_text()
    assert "10 of 48 tokens, 3 of 4 snapshots" in page
    assert _data(page)["times"] == [0.0, 1.0, 1.5]  # snapshots 0, 2, 3 of 4 (ends included)
    positions = np.frombuffer(base64.b64decode(_data(page)["positions"]), dtype="<i2")
    assert positions.size == 2 * 3 * 10 * 3  # two panels: only what is shown was read


def test_animate_writes_viewer_and_movie_into_the_run_folder(tmp_path):
    from attnflow.workflows.animate import animate

    run = _stored(frames=5, n=16)
    run_dir = _run_folder(tmp_path, run)
    calls = []
    written = animate(run_dir, max_frames=3, progress=lambda done, total: calls.append((done, total)))
    assert written == [run_dir / "viewer.html", run_dir / "movie.gif"]
    assert _data(written[0].read_text())["times"] == [0.0, 1.0, 2.0]
    assert calls == [(0, 3), (1, 3), (2, 3), (3, 3)]  # from the first second, in frames of the movie


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"out": "m.avi"}, r"animate: `--out` must end in one of \['.gif', '.mp4'\]; got 'm.avi'\."),
        (
            {"fps": 0},
            r"animate: `--fps`, `--max-tokens` must be >= 1 and `--max-frames` >= 2; got 0, 1000, 100\.",
        ),
    ],
)
def test_animate_refuses_bad_options_before_writing(tmp_path, kwargs, message):
    from attnflow.io.config import ConfigError
    from attnflow.workflows.animate import animate

    (tmp_path / "trajectory.zarr").mkdir()
    with pytest.raises(ConfigError, match=message):
        animate(tmp_path, **kwargs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trajectory.zarr"]


@pytest.mark.parametrize("out", ["missing/m.gif", "folder.gif"])
def test_animate_refuses_a_movie_that_cannot_be_written_before_writing(tmp_path, out):
    from attnflow.io.config import ConfigError
    from attnflow.workflows.animate import animate

    (tmp_path / "trajectory.zarr").mkdir()
    (tmp_path / "folder.gif").mkdir()  # a folder where the file would go
    message = rf"^animate: `--out` must be a file in an existing, writable folder; got '.*{out}'\.$"
    with pytest.raises(ConfigError, match=message):
        animate(tmp_path, out=tmp_path / out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.gif", "trajectory.zarr"]


def test_animate_needs_a_run_folder(tmp_path):
    from attnflow.io.config import ConfigError
    from attnflow.workflows.animate import animate

    with pytest.raises(ConfigError, match=r"animate: `RUN_DIR` must be a run folder with trajectory.zarr"):
        animate(tmp_path)


def test_animate_command_writes_the_viewer_and_refuses_bad_options_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from attnflow.cli import app
    from attnflow.io.store import TrajectoryWriter

    run = _stored(frames=4, n=8)
    with TrajectoryWriter(
        tmp_path / "trajectory.zarr", n_snapshots_max=4, n=8, d=3, xi=run.xi, gauge=run.gauge
    ) as writer:
        for t, x in zip(run.ts, run.xs, strict=True):
            writer.append(t, x)
    result = CliRunner().invoke(app, ["animate", str(tmp_path), "--viewer-only"])
    assert result.exit_code == 0 and (tmp_path / "viewer.html").exists()
    bad = CliRunner().invoke(app, ["animate", str(tmp_path), "--out", str(tmp_path / "m.avi")])
    assert bad.exit_code == 2
    assert bad.output.strip().count("\n") == 0 and "`--out` must end in one of" in bad.output
