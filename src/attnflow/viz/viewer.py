"""A self-contained, offline HTML viewer of a run: the tokens on the sphere, rotatable, with a
time slider; the content ``x`` beside the gauge frame ``u = Q(xi) x`` when the run has a gauge.

The page holds everything it shows (no network, no library): positions of a token subsample at a
subsample of the snapshots, as 16-bit integers in base64, and a small canvas renderer. Colour is
the label on the colour map of every attnflow picture (:mod:`attnflow.viz.colours`), with a key
naming the label's range; faint axes with their names; the run's name and setting (from its
config: n, d, β, gauge, labels, solver); under each panel the mean cosine of the shown tokens at
the shown time, and beside the time the run's energy at that snapshot when the store holds its
metric series; play/pause (or the space bar), a speed control, and the arrow keys to step.

Dimensions above 3 are projected as the figures project them: each view onto the leading
principal directions of its last shown snapshot (PC 1 and PC 2: the plane of the figures' last
panel; PC 3 as depth), one basis for every frame so that the motion reads (the legend says so);
``d = 2`` lies on the equator.

The page is the template ``viewer.html`` with its fields (``__TITLE__``, ``__SETTING__``,
``__LEGEND__``, ``__KEY__``, ``__DATA__``) filled in one pass over the template
(:func:`fill_template`): text put into one field is never searched for another, so a run folder
named ``__DATA__`` stays a title.
"""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path

import numpy as np

from attnflow.io import store
from attnflow.io.atomic import write_text
from attnflow.viz.colours import LABEL_STOPS, label_scale
from attnflow.viz.sphere_panels import _principal_directions

__all__ = [
    "fill_template",
    "first_three",
    "read_run",
    "setting_line",
    "viewed",
    "viewer_html",
    "write_run_viewer",
    "write_viewer",
]

MAX_TOKENS = 1000
MAX_FRAMES = 101
_FIELD = re.compile(r"__([A-Z]+)__")


def fill_template(template: str, fields: Mapping[str, str]) -> str:
    """``template`` with every ``__NAME__`` replaced by ``fields[NAME]``, in one pass: the values
    are inserted as they are and never searched again. Raises ``ValueError`` naming a field of the
    template that ``fields`` lacks."""

    def value(match: re.Match) -> str:
        name = match.group(1)
        if name not in fields:
            raise ValueError(
                f"viewer: the template's field `__{name}__` must be given; got {sorted(fields)!r}."
            )
        return fields[name]

    return _FIELD.sub(value, template)


def first_three(xs: np.ndarray) -> np.ndarray:
    """``(..., d)`` -> ``(..., 3)``: the first three coordinates, zero-padded for ``d = 2``."""
    xs = xs[..., :3]
    if xs.shape[-1] < 3:
        xs = np.concatenate([xs, np.zeros((*xs.shape[:-1], 3 - xs.shape[-1]))], axis=-1)
    return xs


def viewed(stack: np.ndarray) -> np.ndarray:
    """``(F, k, d)`` -> ``(F, k, 3)``: the coordinates a panel shows. Up to ``d = 3`` the first three
    (zero-padded for ``d = 2``); above, the projection onto the three leading principal directions
    of the last frame (PC 1, PC 2 as the figures' plane of that snapshot, PC 3 as depth), the same
    basis for every frame."""
    if stack.shape[-1] <= 3:
        return first_three(stack)
    return stack @ _principal_directions(stack[-1], count=3)


def setting_line(config: Mapping | None) -> str:
    """The run's setting in one line from its resolved config (``""`` when there is none):
    ``n = 64, d = 3, β = 1, gauge rope (full_period), labels positions, rk4 dt = 0.01``."""
    if not isinstance(config, Mapping):
        return ""
    model, gauge = config.get("model") or {}, config.get("gauge") or {}
    aux, solver = config.get("aux") or {}, config.get("solver") or {}
    parts = [f"{key} = {model[key]}" for key in ("n", "d") if key in model]
    if "beta" in model:
        parts.append(f"β = {model['beta']:g}")
    if model.get("time_scale") == "rescaled":
        parts.append("rescaled time")
    kind = gauge.get("kind")
    if kind and kind != "none":
        detail = gauge.get("frequencies") if kind == "rope" else None
        parts.append(f"gauge {kind}" + (f" ({detail})" if detail else ""))
    if aux.get("kind"):
        parts.append(f"labels {aux['kind']}")
    if solver.get("method"):
        step = f" dt = {solver['dt']:g}" if isinstance(solver.get("dt"), int | float) else ""
        parts.append(f"{solver['method']}{step}")
    return ", ".join(parts)


def viewer_html(
    ts: np.ndarray,
    xs: np.ndarray,
    xi: np.ndarray,
    gauge_frame: Callable[[np.ndarray, np.ndarray], np.ndarray] | None,
    *,
    title: str,
    setting: str = "",
    energy: np.ndarray | None = None,
    max_tokens: int = MAX_TOKENS,
    max_frames: int = MAX_FRAMES,
    n_tokens: int | None = None,
    n_snapshots: int | None = None,
) -> str:
    """The page for snapshots ``xs (T, n, d)`` at times ``ts`` with labels ``xi`` and the gauge frame
    ``gauge_frame(x, tokens)`` (``u_i = Q(xi_i) x_i`` of the positions ``x (T', k, d)`` of the tokens
    ``tokens``: ``StoredTrajectory.gauge_frame``), or None without a gauge. ``setting``: a line
    under the title (:func:`setting_line`); ``energy (T,)``: the run's energy at each snapshot, read
    out beside the time. ``n_tokens``, ``n_snapshots``: the run's counts when ``xs`` holds a
    subsample (the legend says how many are shown of how many)."""
    frames, tokens = store.spread(len(ts), max_frames), store.spread(xs.shape[1], max_tokens)
    x = np.asarray(xs[frames][:, tokens], dtype=np.float64)
    panels, stacks = ["content x"], [x]
    if gauge_frame is not None:
        panels.append("gauge frame u = Q(ξ) x")
        stacks.append(gauge_frame(x, tokens))
    d = xs.shape[-1]
    shown_xyz = np.stack([viewed(stack) for stack in stacks])
    scaled = np.round(np.clip(shown_xyz, -1.0, 1.0) * 32767).astype("<i2")
    labels = np.asarray(xi).reshape(len(xi), -1)[:, 0][tokens]
    data = {
        "panels": panels,
        "axes": ["PC 1", "PC 2", "PC 3"] if d > 3 else ["x1", "x2", "x3"],
        "times": [round(float(t), 10) for t in np.asarray(ts)[frames]],
        "phase": [round(float(p), 4) for p in label_scale(labels)],
        "stops": list(LABEL_STOPS),
        "positions": base64.b64encode(scaled.tobytes()).decode("ascii"),
        # per panel and frame: the mean cosine (1/k²) Σ_ij ⟨x_i, x_j⟩ = |mean of x_i|² of the shown tokens
        "mean_cosine": [
            [round(float(v), 4) for v in np.sum(np.mean(s, axis=1) ** 2, axis=-1)] for s in stacks
        ],
    }
    if energy is not None and len(energy) == len(ts):
        values = np.asarray(energy, dtype=float)[frames]
        data["energy"] = [round(float(v), 6) if np.isfinite(v) else None for v in values]
    tokens_shown = f"{len(tokens)} of {n_tokens or xs.shape[1]} tokens"
    shown = f"{tokens_shown}, {len(frames)} of {n_snapshots or len(ts)} snapshots"
    legend = f"{html.escape(shown)}." + (
        f" d = {d} &gt; 3: each view is projected onto the three leading principal directions of its"
        " last shown snapshot (PC 1 and PC 2 span the plane of the figures' last panel, PC 3 is"
        " depth), one basis for every frame; a point inside the circle lies partly off those three."
        if d > 3
        else ""
    )
    low, high = (float(np.min(labels)), float(np.max(labels))) if len(labels) else (0.0, 0.0)
    template = resources.files("attnflow.viz").joinpath("viewer.html").read_text(encoding="utf-8")
    return fill_template(
        template,
        {
            "TITLE": html.escape(title),
            "SETTING": html.escape(setting),
            "LEGEND": legend,
            "KEY": (
                f'<span>label ξ: {low:g}</span><span class="ramp" style="background: linear-gradient('
                f'to right, {", ".join(LABEL_STOPS)})"></span><span>{high:g}</span>'
            ),
            "DATA": json.dumps(data).replace("</", "<\\/"),
        },
    )


def write_viewer(
    stored,
    path: str | Path,
    *,
    title: str,
    n_tokens: int | None = None,
    energy: np.ndarray | None = None,
    **limits,
) -> Path:
    """Write the viewer of a ``StoredTrajectory`` (``attnflow.io.store.read_trajectory``) at ``path``;
    ``n_tokens``: the run's token count when ``stored`` holds a subsample of them; ``energy``: the
    energy at each of its snapshots. The setting line is read from its config."""
    frame = stored.gauge_frame if stored.stored_gauge is not None else None
    page = viewer_html(
        stored.ts,
        stored.xs,
        stored.xi,
        frame,
        title=title,
        setting=setting_line(stored.attrs.get("config")),
        energy=energy,
        n_tokens=n_tokens,
        **limits,
    )
    write_text(Path(path), page)
    return Path(path)


def write_run_viewer(run_dir: str | Path, *, n_snapshots: int, energy=None) -> Path:
    """Write ``viewer.html`` of the run in ``run_dir`` (what ``attnflow run`` leaves beside its
    figures) from its store, of which it reads only what it shows: ``MAX_FRAMES`` of its
    ``n_snapshots`` complete snapshots, ``MAX_TOKENS`` of its tokens. ``energy``: the run's energy
    per snapshot (``None`` entries undefined) when the caller has it; else the store's metric
    series or ``metrics.json`` give it, when they exist."""
    run_dir = Path(run_dir)
    path = run_dir / "trajectory.zarr"
    frames = store.spread(n_snapshots, MAX_FRAMES)
    stored = store.read_trajectory(path, max_tokens=MAX_TOKENS, snapshots=frames)
    if energy is not None:
        energy = np.asarray([np.nan if v is None else v for v in energy], dtype=float)
    else:
        energy = _energy(run_dir, path)
    return write_viewer(
        stored,
        run_dir / "viewer.html",
        title=run_dir.name,
        n_tokens=store.token_count(path),
        n_snapshots=n_snapshots,
        energy=None if energy is None or len(energy) != n_snapshots else energy[frames],
    )


def _energy(run_dir: Path, path: Path) -> np.ndarray | None:
    """The run's energy per snapshot: from the store's metric series, else from ``metrics.json``
    (written after the viewer by a run, present when the viewer is redrawn), else None."""
    series = store.read_series(path)
    if "energy" in series:
        return series["energy"]
    metrics = run_dir / "metrics.json"
    if metrics.is_file():
        values = json.loads(metrics.read_text()).get("series", {}).get("energy")
        if isinstance(values, list):
            return np.asarray([np.nan if v is None else v for v in values], dtype=float)
    return None


def read_run(run_dir: Path, max_tokens: int):
    """The stored trajectory of the run in ``run_dir``, at most ``max_tokens`` of its tokens, and
    its token count."""
    path = Path(run_dir) / "trajectory.zarr"
    return store.read_trajectory(path, max_tokens=max_tokens), store.token_count(path)
