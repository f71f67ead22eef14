"""The metrics of a run: what a run folder's ``metrics.json`` holds (no ``run`` block).

:class:`OnlineSummary` takes a run's snapshots block by block as they are produced (or read back
from a store) and keeps only what the metrics need: the per-snapshot ``series`` (a few numbers
per snapshot) and the latest snapshot. Its :meth:`~OnlineSummary.result` holds the diagnostics
of :func:`attnflow.analysis.metrics.snapshot_summary` for the final snapshot, the energy and its
closed-form maximum (:func:`attnflow.analysis.theory.energy_max`), whether the energy is
non-decreasing, the collapse times, the ``series``, and ``methods``: how each quantity that
has more than one way was computed. :func:`summarize` is the same for a whole ``xs (T, n, d)``;
it never simulates.

Counting and shape (:data:`DESCRIPTIONS`): ``n_clusters`` counts the chains of tokens linked by
angles below ``theta_c`` (connected components of the threshold graph), so a continuum whose
neighbours are closer than ``theta_c`` - a circle, an arc - counts as ONE cluster, beside a mean
cosine near 0; ``n_eff`` is the inverse participation ``1 / Σ p_k²`` of those components' masses.
``shape`` (for d = 3) names what the final state is: dirac, great_circle, arc, antipodal_arcs,
small_circle or clusters (:func:`attnflow.analysis.shapes.classify_shape`); ``gauge_shape`` is the
same for the gauge frame ``u_i = Q(ξ_i) x_i``, where a gauge is set. Shape classes exist on ``S^2``
only: for d != 3 both are null and ``methods["shape"]`` says so.

The cluster angle ``theta_c`` (0.1 rad) is a length on the sphere whatever d, but what it means
changes with d: ``n`` uniform tokens on ``S^{d-1}`` have nearest neighbours about
:func:`uniform_neighbour_angle` apart (0.05 rad for 1024 tokens on ``S^2``, 1.2 rad on ``S^63``),
so in high d a state that has not gathered counts one cluster per token.
``methods["n_clusters"]`` names the angle and, for d > 3, that reference distance.

Layer norms (:mod:`attnflow.numerics.layer_norms`): the metrics are those of the directions ``x``;
for pre- and peri-LN runs (``radial``) the radii ``r = |z|`` of the tokens are added: their mean
and largest value per snapshot (``series``: ``radius_mean``, ``radius_max``) and the final
snapshot's ``radius_mean``, ``radius_min`` and ``radius_max``. Under a layer norm other than post a
gradient-flow layer is no longer the gradient flow itself, but ``E`` still ascends
(``energy_ascends``): ``energy_max`` still bounds it.

Large runs: the energy is exact (``O(n²)`` per snapshot, tiled) or, with ``energy="expansion"``,
the ``O(n)`` expansion within its tolerance (:func:`attnflow.numerics.expansion.expansion_energy`).
The quantities that need every pair (``min_cosine``, ``n_clusters``, ``n_eff``) are exact up to
``PAIRWISE_LIMIT`` tokens; above, the final snapshot's are computed on an evenly spaced subsample
of ``PAIRWISE_LIMIT`` tokens (``methods`` says so) and the ``n_eff`` series is null.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.analysis import metrics
from attnflow.analysis.shapes import classify_shape
from attnflow.analysis.theory import energy_max
from attnflow.core.gauges import Gauge
from attnflow.core.kernel import Kernel, Profile
from attnflow.numerics.expansion import expansion_energy
from attnflow.numerics.summation import energy

__all__ = [
    "COLLAPSE_THRESHOLD",
    "DESCRIPTIONS",
    "ENERGY_TOL",
    "PAIRWISE_KEYS",
    "PAIRWISE_LIMIT",
    "RADIUS_SERIES",
    "OnlineSummary",
    "energy_series",
    "gauge_frames",
    "subsample",
    "summarize",
    "uniform_neighbour_angle",
]

COLLAPSE_THRESHOLD = 0.999  # mean cosine at which a state counts as collapsed (the collapse time)
ENERGY_TOL = 1e-10  # relative decrease allowed between snapshots (round-off of the energy sum)
PAIRWISE_LIMIT = 8192  # above this n the O(n²) diagnostics use a subsample of this many tokens
PAIRWISE_KEYS = ("min_cosine", "n_clusters", "n_eff")
RADIUS_SERIES = ("radius_mean", "radius_max")  # per snapshot, for runs whose tokens have radii

# What the counting and shape entries of metrics.json mean (a reader of "n_clusters = 1" next to a
# mean cosine of 0.01 needs the first line).
DESCRIPTIONS = {
    "n_clusters": (
        "number of chains of tokens at angles below theta_c (connected components of the graph "
        "cos(x_i, x_j) >= cos theta_c): a circle or an arc of close tokens counts as one"
    ),
    "n_eff": "1 / sum_k p_k^2 over the masses p_k of the n_clusters components (1 for a circle too)",
    "shape": (
        "class of the final state (dirac, great_circle, arc, antipodal_arcs, small_circle, clusters; "
        "attnflow.analysis.shapes): classified on S^2 only, null for d != 3"
    ),
    "gauge_shape": "shape of the gauge frame u_i = Q(xi_i) x_i (only where a gauge is set)",
}


def gauge_frames(gauge: Gauge, xs) -> np.ndarray:
    """``u = Q(ξ)x`` for every snapshot of ``xs (T, n, d)``."""
    return np.asarray(jax.vmap(gauge.apply)(jnp.asarray(xs)))


def subsample(n: int, size: int) -> np.ndarray:
    """At most ``size`` token indices out of ``n``, evenly spaced in token order (every
    ``ceil(n/size)``-th, from 0): deterministic, and spread over the labels of positions."""
    return np.arange(0, n, -(-n // size))


@partial(jax.jit, static_argnames=("block_size",))
def _exact_snapshot(kernel: Kernel, x, *, block_size):
    frame = kernel.gauge.apply(x)
    return energy(kernel, x, block_size=block_size), metrics.mean_cosine(x), metrics.mean_cosine(frame)


@partial(jax.jit, static_argnames=("kind", "beta", "c", "tolerance"))
def _expansion_snapshot(kernel: Kernel, x, *, kind, beta, c, tolerance):
    profile = Profile(kind, np.asarray(beta, x.dtype), np.asarray(c, x.dtype))  # concrete: the degree
    e = expansion_energy(Kernel(kernel.gauge, kernel.factor, profile), x, tolerance=tolerance)
    return e, metrics.mean_cosine(x), metrics.mean_cosine(kernel.gauge.apply(x))


def _snapshot_function(kernel: Kernel, method: str, *, block_size: int | None, tolerance: float):
    """``x -> (E(x), mean cosine of x, mean cosine of its gauge frame)``: one compiled program per
    structure (``jax.jit``; the kernel is an argument). The expansion's degree follows from β, so
    its program holds the profile's numbers (static arguments)."""
    if method not in ("exact", "expansion"):
        raise ValueError(f"summarize: `energy` must be 'exact' or 'expansion'; got {method!r}.")
    if method == "expansion":
        profile = kernel.profile
        numbers = dict(kind=profile.kind, beta=float(profile.beta), c=float(profile.c), tolerance=tolerance)

        def evaluate(x):
            return _expansion_snapshot(kernel, x, **numbers)
    else:

        def evaluate(x):
            return _exact_snapshot(kernel, x, block_size=block_size)

    def measure(x) -> tuple[float, float, float]:
        return tuple(float(v) for v in evaluate(x))

    return measure


def _field_measure(field):
    """``x -> (E(x), mean cosine, mean cosine)`` for a field with its own ``energy`` (heads: the
    content is its own frame)."""
    evaluate = jax.jit(lambda x: (field.energy(x), metrics.mean_cosine(x)))

    def measure(x) -> tuple[float, float, float]:
        e, c = evaluate(jnp.asarray(x))
        return float(e), float(c), float(c)

    return measure


def energy_series(kernel: Kernel, xs, *, block_size: int | None = None) -> np.ndarray:
    """``E`` of every snapshot of ``xs (T, n, d)`` (one compiled evaluation, called per snapshot)."""
    fn = _snapshot_function(kernel, "exact", block_size=block_size, tolerance=0.0)
    return np.array([fn(x)[0] for x in xs])


class OnlineSummary:
    """The metrics of a run, accumulated snapshot by snapshot: memory ``O(n d)`` whatever the number
    of snapshots (the latest snapshot and a few numbers per snapshot).

    ``add(ts, xs)``: the next block ``ts (G,)``, ``xs (G, n, d)`` of snapshots, in order.
    ``result()``: the metrics dict (``summarize``'s). ``groups``: prompt ids (the conditional
    spread); ``block_size``: the exact energy's evaluation (the run's; the value is the same to
    round-off); ``energy``: ``"exact"`` or ``"expansion"`` (within ``tolerance`` of the energy's
    scale ``φ'(1)/(2β)``); ``theta_c``: the cluster angle; ``field``: the run's field (a layer of
    heads has its own energy; a layer norm says whether ``E`` ascends); ``radial``: the run's tokens
    have radii (pre-, peri-LN), given to ``add`` as ``radii (G, n)``.
    """

    def __init__(
        self,
        kernel: Kernel,
        *,
        groups: np.ndarray | None = None,
        block_size: int | None = None,
        energy: str = "exact",
        tolerance: float = 1e-10,
        theta_c: float = 0.1,
        field=None,
        radial: bool = False,
    ) -> None:
        self.kernel, self.groups, self.theta_c = kernel, groups, theta_c
        self.energy_method, self.tolerance = energy, tolerance
        self.gradient_flow = True if field is None else bool(field.gradient_flow)
        # E non-decreasing: a gradient flow, or a gradient-flow layer under a layer norm
        self.ascends = bool(getattr(field, "energy_ascends", self.gradient_flow))
        self.layer_norm = getattr(field, "kind", "post")
        layer = getattr(field, "layer", field)  # under a layer norm, the layer itself
        self.heads = hasattr(layer, "heads")
        self.radial = radial
        if self.heads:  # a layer of heads: its own energy (the kernel is the identity's)
            self.energy_method = "heads (sum over the heads of (1/(2n^2)) sum_ij w_ij phi(<q_i, k_j>))"
            self._measure = _field_measure(layer)
        else:
            self._measure = _snapshot_function(kernel, energy, block_size=block_size, tolerance=tolerance)
        names = ("t", "energy", "mean_cosine", "gauge_mean_cosine", "n_eff")
        self.series: dict[str, list] = {k: [] for k in names + (RADIUS_SERIES if radial else ())}
        self.last: np.ndarray | None = None
        self.last_radii: np.ndarray | None = None

    @property
    def count(self) -> int:
        """Snapshots added so far."""
        return len(self.series["t"])

    def add(self, ts, xs, radii=None) -> None:
        if (radii is not None) != self.radial:
            raise ValueError(
                f"summarize: `radii` must be given exactly for a radial run (radial = {self.radial}); "
                f"got {'none' if radii is None else 'radii'}."
            )
        if self.radial:
            if len(radii) != len(ts):
                raise ValueError(
                    f"summarize: `radii` must hold one row per time ({len(ts)}); got {len(radii)}."
                )
            for r in np.asarray(radii):
                self.series["radius_mean"].append(float(np.mean(r)))
                self.series["radius_max"].append(float(np.max(r)))
                self.last_radii = r
        for t, x in zip(np.asarray(ts, dtype=float), xs, strict=True):
            x = np.asarray(x)
            e, mean_cosine, gauge_mean_cosine = self._measure(x)
            self.series["t"].append(float(t))
            self.series["energy"].append(e)
            self.series["mean_cosine"].append(mean_cosine)
            self.series["gauge_mean_cosine"].append(gauge_mean_cosine)
            pairwise = x.shape[0] <= PAIRWISE_LIMIT
            self.series["n_eff"].append(metrics.n_eff(x, theta_c=self.theta_c) if pairwise else None)
            self.last = x

    def result(self) -> dict:
        if self.last is None:
            raise ValueError("summarize: `xs` must hold at least one snapshot; got none.")
        x, kernel, n = self.last, self.kernel, self.last.shape[0]
        q = None if kernel.gauge.is_identity else kernel.gauge.matrices()  # one copy: jnp, not np
        pairwise = n <= PAIRWISE_LIMIT
        final = metrics.snapshot_summary(x, q=q, groups=self.groups, theta_c=self.theta_c, pairwise=pairwise)
        methods = {"energy": self.energy_method}
        if self.energy_method == "expansion":
            methods["energy"] = f"expansion (tolerance {self.tolerance:g} of the energy's scale)"
        if not pairwise:
            rows = subsample(n, PAIRWISE_LIMIT)
            part = metrics.snapshot_summary(
                x[rows], q=None if q is None else q[rows], theta_c=self.theta_c, pairwise=True
            )
            final.update({key: part[key] for key in PAIRWISE_KEYS})
            how = f"subsample of {rows.size} of {n} tokens (one in {rows[1] - rows[0]})"
            methods.update({key: how for key in PAIRWISE_KEYS}, series_n_eff="skipped (null)")
        energies = np.asarray(self.series["energy"], dtype=float)
        e_max = energy_max(kernel) if self.ascends and not self.heads else None
        e_last = float(energies[-1])
        if not self.gradient_flow and self.ascends:
            methods["energy_gap"] = methods["energy_monotone"] = (
                f"layer norm {self.layer_norm!r}: each token turns along its own gradient at a positive "
                "speed factor, so not the gradient flow itself, but E of the directions is non-decreasing "
                "and bounded by energy_max"
            )
        elif not self.gradient_flow:
            methods["energy_gap"] = methods["energy_monotone"] = (
                "not a gradient flow (a causal mask, softmax rows, values outside the gradient, or heads "
                "outside cases (a)/(b)): E is measured, but nothing makes it monotone or bounds it"
            )
        final.update(
            energy=e_last,
            energy_max=e_max,
            energy_gap=None if e_max is None else _relative_gap(e_max, e_last),
            gradient_flow=self.gradient_flow,
            energy_monotone=metrics.is_monotone(energies, tol=self._monotone_tol(e_last)),
            collapse_time=metrics.collapse_time(
                self.series["t"], self.series["mean_cosine"], threshold=COLLAPSE_THRESHOLD
            ),
            gauge_collapse_time=metrics.collapse_time(
                self.series["t"], self.series["gauge_mean_cosine"], threshold=COLLAPSE_THRESHOLD
            ),
        )
        final["shape"] = _shape(x)
        if q is not None:
            final["gauge_shape"] = _shape(np.einsum("nij,nj->ni", q, x))
        d = x.shape[1]
        if d != 3:
            methods["shape"] = f"not classified: shape classes exist on S^2 only (d = 3); here d = {d}"
        clusters = f"chains of tokens at angles below theta_c = {self.theta_c:g} rad"
        if d > 3:
            clusters += (
                f"; {n} uniform tokens on S^{d - 1} have nearest neighbours about "
                f"{uniform_neighbour_angle(n, d):.2g} rad apart, so a spread state counts each token"
            )
        if "n_clusters" in methods:  # the subsample it was counted on
            clusters += f" ({methods['n_clusters']})"
        methods["n_clusters"] = clusters
        if self.radial:
            r = np.asarray(self.last_radii, dtype=float)
            final.update(radius_mean=float(r.mean()), radius_min=float(r.min()), radius_max=float(r.max()))
            methods["radius"] = (
                f"the radii r_i = |z_i| of the {self.layer_norm}-LN tokens z_i = r_i x_i (r_i(0) = 1): "
                "mean, min and max over the tokens; the other metrics are those of the directions x"
            )
        final["series"] = {k: list(v) for k, v in self.series.items()}
        final["methods"] = methods
        return final

    def _monotone_tol(self, e_last: float) -> float:
        """Round-off of the energy sum, plus twice the expansion's error bound where it is used."""
        tol = ENERGY_TOL * max(1.0, abs(e_last)) if np.isfinite(e_last) else 0.0
        if self.energy_method == "expansion" and self.kernel.profile.kind == "exp":
            scale = float(self.kernel.profile.scale) / (2.0 * float(self.kernel.profile.beta))
            tol += 2.0 * self.tolerance * scale
        return tol


def summarize(
    kernel: Kernel,
    ts,
    xs,
    *,
    groups: np.ndarray | None = None,
    block_size: int | None = None,
    theta_c: float = 0.1,
) -> dict:
    """Every diagnostic of the final snapshot of ``xs (T, n, d)`` and the ``series`` block
    (:class:`OnlineSummary` over the whole stack, exact energy)."""
    summary = OnlineSummary(kernel, groups=groups, block_size=block_size, theta_c=theta_c)
    summary.add(ts, np.asarray(xs))
    return summary.result()


def uniform_neighbour_angle(n: int, d: int) -> float:
    """The median angle from a token to its nearest neighbour among ``n`` independent uniform tokens
    on ``S^{d-1}``: the ``θ`` with ``(1 − F(θ))^{n−1} = 1/2``, ``F`` the law of the angle between two
    uniform points (density ``∝ sin^{d−2} θ`` on ``[0, π]``), on a grid of 4097 angles."""
    if n < 2:
        return float(np.pi)
    theta = np.linspace(0.0, np.pi, 4097)
    density = np.sin(theta) ** (d - 2)
    cdf = np.concatenate([[0.0], np.cumsum((density[1:] + density[:-1]) / 2.0)])
    cdf /= cdf[-1]
    # P(nearest > θ) = (1 − F(θ))^{n−1} = 1/2
    target = 1.0 - 0.5 ** (1.0 / (n - 1))
    return float(np.interp(target, cdf, theta))


def _shape(x: np.ndarray) -> str | None:
    """:func:`classify_shape` of a finite state on ``S^2``; None for d != 3 or a non-finite state."""
    if x.ndim != 2 or x.shape[1] != 3 or not np.isfinite(x).all():
        return None
    return classify_shape(x)


def _relative_gap(e_max: float | None, e: float) -> float | None:
    """``(E_max - E) / E_max``; None where undefined (no closed form, ``E_max = 0``, a non-finite value)."""
    if e_max is None or e_max == 0 or not np.isfinite(e_max) or not np.isfinite(e):
        return None
    return (e_max - e) / e_max
