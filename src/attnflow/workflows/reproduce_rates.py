"""Values from the closed forms of the flow (:mod:`attnflow.analysis.theory`), measured on a
reproduce job's snapshots where the closed form holds (None elsewhere): :data:`THEORY_METRICS`.

They see what the end states of the paper's experiments do not: β, the clock (the profile's ``c``,
the time scale), the factor's matrix, the softmax and the expansion. Near a collapsed state the
field is linear in the displacements, with rates in closed form; each rate row fits the decay of a
deficit over its first stretch of saved times inside a window (linear regime above, the solver's
error floor below, :func:`fitted_rate`) and divides it by the predicted rate. The equiangular
reduction and the causal two-token motion are whole trajectories in closed form.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnflow.workflows.build import Simulation
from attnflow.workflows.experiments import Experiment

__all__ = ["THEORY_METRICS", "fitted_rate", "realisation_rate_ratio", "theory_values"]

THEORY_METRICS = {
    "collapse_rate_ratio": "the decay rate of 1 - mean cosine near the Dirac (gauge frame; the content for "
    "logits_only values; a realisation's gauge frame), fitted on its first stretch in [1e-9, 1e-4], over the "
    "slowest rate of the linearisation at the final state (attnflow.analysis.theory.collapse_rates; w = 1: "
    "2 c e^beta)",
    "collapse_rate_ceiling": "the fastest over the slowest rate of that linearisation (1 for w = 1): "
    "collapse_rate_ratio lies between 1 and it",
    "circle_rate_ratio": "the decay rate of planarity on its first stretch in [1e-6, 1e-4], over the "
    "great circle's slowest rate out of its plane (attnflow.analysis.theory.circle_normal_rate; "
    "Toeplitz cosine factor, no gauge)",
    "circle_label_order": "max over the two orientations of |(1/n) sum_i z_i e^{-+ i omega xi_i}|, z_i the "
    "tokens in the complex coordinate of their best plane: 1 on the circle x_i = (cos omega xi_i, "
    "sin omega xi_i) of the labels, about 0 unordered",
    "first_token_rate_ratio": "the decay rate of first_token_distance on its first stretch in [1e-6, "
    "1e-2], over the slowest rate of the linearisation near the first token's point: 1/2 for a causal "
    "softmax layer (inclusive mask; attnflow.analysis.theory.first_token_rate), c e^beta k/n for k held "
    "sources of the usa field (attnflow.analysis.theory.source_rate)",
    "axis_rate_ratio": "the decay rate of 1 - min_i |<x_i, e>| on the last 3 points of its first stretch in "
    "[1e-9, 1e-4], over "
    "twice the slowest rate of the linearisation at +-e of the shared-map gradient layer "
    "(attnflow.analysis.theory.axis_rate; W_Q = W_K = W_V = W, W_O = W^T, no gauge, usa, no mask)",
    "axis_rate_ceiling": "the fastest over the slowest rate of that linearisation: axis_rate_ratio lies "
    "between 1 and it",
    "label_order": "(c - m)/(1 - m), c the mean of <x_i, x_j> over the tokens next to each other in label "
    "order and m the mean cosine (a factor of the labels, no gauge): the share of the spread that the "
    "labels order, 1 where tokens close in label gather, about 0 where the labels do not order the state",
    "second_token_error": "|theta(t) - theta_ODE(t)|, theta the angle of the second token to the first one "
    "(which never moves) and theta_ODE the closed-form two-token motion of a causal softmax layer with "
    "values I (attnflow.analysis.theory.second_token_angle)",
    "equiangular_error": "|mean cosine(t) - rho(t)| of the gauge frame (the content without a gauge), rho "
    "the equiangular reduction's ODE from the measured rho(0) (attnflow.analysis.theory.equiangular_rho; "
    "under a layer norm, or with a gauge, equiangular_layer_norm); equiangular data, w = 1, gradient value",
    "equiangular_energy_error": "|E(t)/E_ODE(t) - 1|, E the measured energy and E_ODE the energy of "
    "equiangular tokens at the ODE's rho(t) (attnflow.analysis.theory.equiangular_energy); no gauge, post-LN",
    "equiangular_spread": "max_{i != j} |<u_i, u_j> - mean cosine| of the gauge frame u: how far it is "
    "from equiangular",
    "equiangular_radius_error": "max_i |r_i(t)/r(t) - 1|, r_i the radii of pre- and peri-LN tokens and r(t) "
    "the equiangular reduction's (attnflow.analysis.theory.equiangular_layer_norm)",
    "equiangular_orbit_error": "|d(t)/d_ODE(t) - 1|, d = max_i |u_i - u*| the content's distance to its "
    "orbit point Q_i^T u* (u* the gauge frame's normalised mean) and d_ODE its closed form from the "
    "reduction's 1 - rho(t) (attnflow.analysis.theory.equiangular_orbit_residual); with a gauge",
    "mean_radius": "the mean radius of the tokens (pre- and peri-LN; 1 on the sphere)",
}
RATE_WINDOW = (1e-9, 1e-4)  # 1 - mean cosine: linear regime (|eps| ~ 1e-2: corrections 1e-4 relative),
# 100x above the error floor of DP5 at rtol 1e-5 (1e-11, seen after the collapse)
RATE_POINTS = 3  # saved times in the window needed for a fitted rate (E13 saves every 0.5: 4 in it)
CIRCLE_WINDOW = (1e-6, 1e-4)  # planarity: past the faster modes (1e-4), 10x above the error floor of DP5 at
# rtol 1e-6 (1e-7, seen after tau = 80)
FIRST_TOKEN_WINDOW = (1e-6, 1e-2)  # first_token_distance: linear regime, 10x above DP5's error at rtol 1e-6


def fitted_rate(ts: np.ndarray, deficit: np.ndarray, window: tuple[float, float] = RATE_WINDOW,
                 last: int | None = None) -> float | None:  # fmt: skip
    """``−`` the least-squares slope of ``log deficit`` over its first stretch of saved times in
    ``window``: from its last entry below the top before it first falls below the bottom (after
    that the solver's error floor), or its ``last`` points; None with fewer than :data:`RATE_POINTS`
    points in the stretch."""
    low, high = window
    finite = np.isfinite(deficit)
    below = np.flatnonzero(finite & (deficit < low))
    stop = below[0] if below.size else len(deficit)
    above = np.flatnonzero(~finite[:stop] | (deficit[:stop] > high))
    start = above[-1] + 1 if above.size else 0
    if stop - start < RATE_POINTS:
        return None
    if last is not None:  # the asymptotic end of the stretch: the slowest mode has taken over
        start = max(start, stop - last)
    return float(-np.polyfit(ts[start:stop], np.log(deficit[start:stop]), 1)[0])


def realisation_rate_ratio(ts, us, *, beta: float, c: float) -> float | None:
    """``collapse_rate_ratio`` of a realisation (``w = 1``, exp profile, usa: its gauge frame ``us
    (T, n, d)`` collapses to a Dirac, :func:`attnflow.analysis.theory.collapse_rates` gives the rate
    ``2 c e^β`` at its final state): the decay rate of ``1 − mean cosine`` of ``us`` fitted on its
    first stretch in :data:`RATE_WINDOW` (above the round-off floor of RK4's fixed steps, 1e-14), over
    that rate; None without a stretch (a realisation that never collapses, or one saved too rarely
    for its rate: E7 and E8 save every RK4 step, 0.2, and the window holds 10 of them at rate 2e)."""
    from attnflow.analysis import theory

    us = np.asarray(us, dtype=np.float64)
    n = us.shape[1]
    m = us.mean(axis=1)
    deficit = 1.0 - (n * np.sum(m * m, axis=-1) - 1.0) / (n - 1)
    fitted = fitted_rate(np.asarray(ts, dtype=np.float64), deficit)
    if fitted is None or not np.all(np.isfinite(us[-1])):
        return None
    slowest, _ = theory.collapse_rates(us[-1], np.ones((n, n)), beta=beta, c=c)
    return fitted / slowest


def _equiangular_values(ts, mean_cos, gauge_mean_cos, us, radii, energies, *, kind: str, alpha: float,
                        gauged: bool, **options) -> dict[str, Any]:  # fmt: skip
    """The equiangular values of one seed (cosines ``(T,)``, gauge frame ``us (T, n, d)``, radii
    ``(T, n)`` or None, energies ``(T,)`` or None): without a gauge and a layer norm, E14's ODE
    (``equiangular_rho``) and the energy at its ``ρ(t)`` (``equiangular_energy``); else the
    reduction under the norm in the gauge frame (conjugate to the gauge-free flow under every norm,
    for the gradient value: ``equiangular_layer_norm``), the radii's error and the orbit's."""
    from attnflow.analysis import theory

    n = us.shape[1]
    if kind == "post" and not gauged:
        rho, deficit, radius = theory.equiangular_rho(ts, rho0=float(mean_cos[0]), n=n, **options), None, None
    else:
        flow = theory.equiangular_layer_norm(ts, rho0=float(gauge_mean_cos[0]), n=n, layer_norm=kind,
                                             alpha=alpha, **options)  # fmt: skip
        rho, deficit, radius = flow
    gram = np.einsum("tid,tjd->tij", us, us)
    off = ~np.eye(n, dtype=bool)
    values = {
        "equiangular_error": np.abs(gauge_mean_cos - rho),
        "equiangular_spread": np.max(np.abs(gram[:, off] - gauge_mean_cos[:, None]), axis=1),
    }
    if radii is not None:
        values["equiangular_radius_error"] = np.max(np.abs(radii / radius[:, None] - 1.0), axis=1)
    if kind == "post" and not gauged and energies is not None:
        closed = theory.equiangular_energy(rho, n=n, beta=options["beta"], c=options["c"])
        values["equiangular_energy_error"] = np.abs(energies / closed - 1.0)
    if gauged:
        centre = np.sum(us, axis=1)
        centre /= np.linalg.norm(centre, axis=-1, keepdims=True)
        distance = np.max(np.linalg.norm(us - centre[:, None], axis=-1), axis=1)
        closed = theory.equiangular_orbit_residual(deficit, n)
        values["equiangular_orbit_error"] = np.abs(distance / closed - 1.0)
    return values


def _identity_values(head) -> bool:
    """Values and output maps the identity (``W_V = W_O = I``)."""
    value, output = np.asarray(head.value), np.asarray(head.output)
    return value.shape[0] == value.shape[1] and np.array_equal(value, np.eye(len(value))) and np.array_equal(
        output, np.eye(len(output)))  # fmt: skip


def _shared(head) -> bool:
    """Case (a) of a gradient head without a gauge: ``W_Q = W_K = W_V = W``, ``W_O = Wᵀ``."""
    query, key, value, output = (np.asarray(m) for m in (head.query, head.key, head.value, head.output))
    same = np.array_equal(query, key) and np.array_equal(query, value) and np.array_equal(output, query.T)
    return same and head.gauge.is_identity


def _identity_maps(head) -> bool:
    """Every map of the head the identity: the paper's field as a layer."""
    query, key = np.asarray(head.query), np.asarray(head.key)
    eye = np.eye(*query.shape)
    return _identity_values(head) and np.array_equal(query, eye) and np.array_equal(key, eye)


def _is_layer(field) -> bool:
    return hasattr(field, "heads") or field.causal is not False or field.sources > 0


def theory_values(sim: Simulation, w: np.ndarray | None, ts, mean_cos, gauge_mean_cos, xs, us,
                  experiment: Experiment, *, axis=None, norm=None, radii=None,
                  energies=None) -> list[dict[str, Any]]:  # fmt: skip
    """:data:`THEORY_METRICS` of each seed (the same at every report time, except the equiangular
    values and the second token's error, ``(T,)`` per seed): ``w`` the factor matrix (None for heads),
    cosines ``(T, B)``, ``xs`` and the gauge frames ``us (T, B, n, d)``, ``axis`` the first head's
    logit axis (the top eigenvector of sym(W_Qᵀ W_K)); ``norm`` the layer norm the field ran under
    (a :class:`~attnflow.numerics.layer_norms.LayerNormField`, ``sim.field`` its layer; None: post-LN)
    and ``radii (T, B, n)`` its tokens' radii (pre, peri); ``energies (T, B)`` the measured energies
    (None: no energy row)."""
    from attnflow.analysis import theory

    field = sim.field
    heads = getattr(field, "heads", None)
    profile = field.profile if heads else sim.kernel.profile
    count = xs.shape[1]
    blank = [{key: None for key in THEORY_METRICS} for _ in range(count)]
    paper_head = heads is not None and len(heads) == 1 and _identity_maps(heads[0])
    if paper_head:  # the paper's field as a layer (rotated values: "gradient"; plain: "logits_only")
        w = np.asarray(heads[0].factor.dense(), dtype=np.float64)
    value = getattr(field, "value", "gradient") if not paper_head else (
        "gradient" if heads[0].values == "rotated" else "logits_only")  # fmt: skip
    unmasked = field.causal is False and field.sources == 0 and field.normalization == "usa"
    kind, alpha = ("post", 1.0) if norm is None else (norm.kind, float(norm.alpha))
    plain = profile.kind == "exp" and unmasked and (not _is_layer(field) or paper_head) and kind == "post"
    beta, c = float(profile.beta), float(profile.c)
    n = xs.shape[2]
    init = experiment.config.get("init", {}).get("kind", "uniform")
    if plain:
        for b in range(count):
            collapsing = gauge_mean_cos if value == "gradient" else mean_cos
            fitted = fitted_rate(ts, 1.0 - collapsing[:, b])
            if fitted is None or not np.all(np.isfinite(us[-1, b])):
                continue
            slowest, fastest = theory.collapse_rates(us[-1, b], w, beta=beta, c=c)
            blank[b]["collapse_rate_ratio"] = fitted / slowest
            blank[b]["collapse_rate_ceiling"] = fastest / slowest
    factor = sim.kernel.factor
    if not heads and hasattr(factor, "xi") and sim.kernel.gauge.is_identity:
        order = np.argsort(np.asarray(factor.xi, dtype=np.float64), kind="stable")
        for b in range(count):
            ordered = xs[:, b, order]
            neighbours = np.mean(np.sum(ordered[:, 1:] * ordered[:, :-1], axis=-1), axis=1)
            spread = 1.0 - mean_cos[:, b]
            share = (neighbours - mean_cos[:, b]) / np.where(spread > 1e-12, spread, np.nan)
            blank[b]["label_order"] = np.where(np.isfinite(share), share, np.nan)
    circle = hasattr(factor, "omega") and sim.kernel.gauge.is_identity
    if plain and not heads and value == "gradient" and circle:
        omega, xi = float(factor.omega), np.asarray(factor.xi, dtype=np.float64)
        expected = theory.circle_normal_rate(xi, omega, beta=beta, c=c)
        for b in [b for b in range(count) if np.all(np.isfinite(xs[:, b]))]:
            planes = np.linalg.eigh(np.einsum("tid,tie->tde", xs[:, b], xs[:, b]))[1]  # (T, d, d) ascending
            planarity = np.max(np.abs(np.einsum("tid,td->ti", xs[:, b], planes[:, :, 0])), axis=1)
            fitted = fitted_rate(ts, planarity, CIRCLE_WINDOW)
            blank[b]["circle_rate_ratio"] = None if fitted is None or expected <= 0 else fitted / expected
            z = np.einsum("tid,td->ti", xs[:, b], planes[:, :, -1]) + 1j * np.einsum(
                "tid,td->ti", xs[:, b], planes[:, :, -2])  # fmt: skip
            phase = np.exp(1j * omega * xi)
            blank[b]["circle_label_order"] = np.maximum(
                np.abs(np.mean(z * phase.conj(), axis=1)), np.abs(np.mean(z * phase, axis=1)))  # fmt: skip
    if heads is not None and len(heads) == 1 and unmasked and profile.kind == "exp" and _shared(heads[0]):
        weight = np.asarray(heads[0].query, dtype=np.float64)
        for b in [b for b in range(count) if np.all(np.isfinite(xs[:, b]))]:
            deficit = 1.0 - np.min(np.abs(xs[:, b] @ axis), axis=1)
            fitted = fitted_rate(ts, deficit, last=RATE_POINTS)
            if fitted is not None:
                slowest, fastest = theory.axis_rates(np.sign(xs[-1, b] @ axis), weight, beta=beta, c=c)
                blank[b]["axis_rate_ratio"] = fitted / (2.0 * slowest)
                blank[b]["axis_rate_ceiling"] = fastest / slowest
    causal_sa = heads is not None and field.causal is not False and field.normalization == "sa"
    held = paper_head and field.sources > 0 and field.causal is False and field.normalization == "usa"
    if causal_sa and field.causal is True or held and heads[0].gauge.is_identity:
        if held:
            expected = theory.source_rate(n, field.sources, beta=beta, c=c)
        else:
            expected = theory.first_token_rate(n)
        for b in range(count):
            distance = np.max(np.linalg.norm(xs[:, b] - xs[0, b, 0], axis=-1), axis=-1)
            fitted = fitted_rate(ts, distance, FIRST_TOKEN_WINDOW)
            blank[b]["first_token_rate_ratio"] = None if fitted is None else fitted / expected
    if causal_sa and field.sources == 0 and len(heads) == 1 and _identity_values(heads[0]):
        head = heads[0]
        for b in [b for b in range(count) if np.all(np.isfinite(xs[:, b, :2]))]:
            theta = theory.second_token_angle(ts, xs[0, b, 0], xs[0, b, 1], query=head.query, key=head.key,
                                              beta=beta, strict=field.causal == "strict")  # fmt: skip
            cosine = np.clip(np.einsum("td,d->t", xs[:, b, 1], xs[0, b, 0]), -1.0, 1.0)
            blank[b]["second_token_error"] = np.abs(np.arccos(cosine) - theta)
    gauged = not sim.kernel.gauge.is_identity
    flat = w is not None and bool(np.all(w == 1.0)) and (not gauged or value == "gradient")
    if radii is not None:
        for b in range(count):
            blank[b]["mean_radius"] = np.mean(radii[:, b], axis=-1)
    if init == "equiangular" and flat and not _is_layer(field) and profile.kind == "exp":
        for b in range(count):
            radii_b = None if radii is None else radii[:, b]
            energies_b = None if energies is None else energies[:, b]
            series = (mean_cos[:, b], gauge_mean_cos[:, b], us[:, b], radii_b, energies_b)
            blank[b] |= _equiangular_values(ts, *series,
                                            kind=kind, alpha=alpha, gauged=gauged, beta=beta, c=c,
                                            normalization=field.normalization)  # fmt: skip
    return blank
