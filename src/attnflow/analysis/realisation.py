"""Realisation constructions: choose the gauge so that the dynamics end on a target law.

Everything here is mathematics on arrays: the gauges, the initial data, the checks of a target and
the measurement of a final state against it. Running the dynamics is
:func:`attnflow.workflows.realize.realize`.

Orbit universality (RoPE about ``e_3`` in d = 3)
    A target angle law ``ν`` (a :class:`~attnflow.analysis.laws.VonMisesMixture`, an
    :class:`~attnflow.analysis.laws.EmpiricalAngleLaw` of samples, or any object with
    ``cdf``/``ppf``) is realised on one rotation orbit by reparametrising the phase:
    ``ξ_i = (i+½)/n``, ``α_i = F_ν⁻¹(ξ_i)`` (:func:`orbit_angles`). The gauge is ``Q_i = R(α_i)``
    with ``R(α)ᵀ`` the rotation by ``+α`` about ``e_3`` (:func:`orbit_gauge`), so the maximiser
    ``x_i = Q_iᵀ u*`` sits at azimuth ``az(u*) + α_i``: the **relative angles** ``az(x_i) − az(u*)``
    (mod 2π) are ``α_i``, within Kolmogorov–Smirnov distance ``1/(2n)`` of ``ν``. (As RoPE angles
    this gauge stores ``−α_i``.) The dynamics pick the base point ``u*``.

Gauge-level realisation (points on the sphere)
    Target points ``y_i = g(ξ_i)`` and a reference ``v_0``: gauges with ``Q_i y_i = v_0``
    (:func:`householder_gauges`, :func:`rotation_gauges`), initial data in a cap around ``v_0`` in
    the gauge frame. The dynamics end at ``x_i = Q_iᵀ u*`` with ``u*`` near ``v_0``, so
    ``|x_i − y_i| ≤ |u* − v_0| + orbit_residual ≤ 2|u* − v_0|`` (when the residual is below
    ``|u* − v_0|``).

Two modes (:data:`MODES`)
    ``"a-priori"``: the gauges are fixed before the run (``Q_i y_i = v_0``, or the orbit gauge), and
    the dynamics pick ``u*``: the target is realised up to ``|u* − v_0|`` (about ``1e-2`` for a cap
    of width 0.2, and of order 1 for initial data far from ``v_0``). ``"exact"``: the gauge frame is
    simulated first (its dynamics do not depend on the gauges: the energy is a function of
    ``u_i = Q_i x_i`` only, and the gradient flow is conjugate), it reaches a consensus ``u*``, and
    the gauges are chosen from that ``u*``: ``Q'_i = Rᵀ Q_i`` with ``R`` a rotation taking ``u*`` to
    the reference point (``v_0``; ``e_1`` for an orbit, whose targets then are the absolute
    azimuths ``α_i`` on the equator), so ``Q'_i y_i = u*``. The dynamics of ``x`` only see
    ``Q'_iᵀQ'_j = Q_iᵀQ_j``, so the same kernel serves and only the initial content changes:
    ``x_0 = Q'ᵀu_0 = Qᵀ(R u_0)`` (:func:`exact_initial`). The run then ends at ``x_i → Q_iᵀ R u*
    = y_i``: the target is realised to the convergence of the gauge frame (the orbit residual),
    from any initial data.

:func:`orbit_construction` and :func:`sphere_construction` set a realisation up (kernel with
``w = 1`` and the exp profile, ``c = 1``; initial data); :func:`measure_realisation` measures a
final state (:class:`RealisationResult`).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.analysis import metrics
from attnflow.analysis.laws import as_angle_law
from attnflow.core import sphere
from attnflow.core.factors import NoFactor
from attnflow.core.gauges import DenseGauge, IdentityGauge, RoPE, check_orthogonal
from attnflow.core.kernel import Kernel, make_profile
from attnflow.numerics.solve import Trajectory

__all__ = [
    "GAUGES",
    "MODES",
    "Construction",
    "RealisationResult",
    "check_orbit_samples",
    "check_sphere_targets",
    "check_mode",
    "check_n",
    "exact_initial",
    "frame_kernel",
    "householder_gauges",
    "measure_realisation",
    "orbit_angles",
    "orbit_construction",
    "orbit_gauge",
    "rotation_gauges",
    "rotation_to",
    "sphere_construction",
]

TWO_PI = 2.0 * np.pi
UNIT_TOL = 1e-6  # |‖y_i‖ − 1| allowed for sphere targets read from a file
WASSERSTEIN_MAX_N = 2048  # the exact W1 is an O(n³) assignment problem: skipped (None) above this
GAUGES = ("householder", "rotation")
MODES = ("a-priori", "exact")


# --------------------------------------------------------------------------- gauges of the constructions


def orbit_angles(ppf, n: int) -> np.ndarray:
    """``α_i = ppf((i+½)/n)``, ``i = 0..n−1`` (``ppf`` a quantile function or a law with ``ppf``)."""
    quantile = ppf.ppf if hasattr(ppf, "ppf") else ppf
    return np.asarray(quantile((np.arange(n) + 0.5) / n), dtype=np.float64).reshape(n)


def orbit_gauge(angles, d: int = 3) -> RoPE:
    """``Q_i = R(α_i)``, ``R(α)ᵀ`` the rotation by ``+α`` about ``e_3`` (the pair ``(0, 1)``).

    Stored as RoPE angles ``−α_i`` of shape ``(n, 1)``, so ``Q_iᵀ v`` has azimuth ``az(v) + α_i``.
    """
    angles = np.asarray(angles, dtype=np.float64).reshape(-1)
    if d < 2:
        raise ValueError(f"orbit_gauge: `d` must be >= 2; got {d!r}.")
    return RoPE(angles=jnp.asarray(-angles[:, None]), d=d)


def _unit_rows(y, v0, where: str) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(y, dtype=np.float64)
    if y.ndim != 2 or y.shape[1] < 2:
        raise ValueError(f"{where}: `targets` must be an (n, d) array with d >= 2; got shape {y.shape}.")
    v0 = np.asarray(v0, dtype=np.float64).reshape(-1)
    if v0.shape != (y.shape[1],) or not np.linalg.norm(v0) > 0:
        raise ValueError(f"{where}: `v0` must be a non-zero vector of length d = {y.shape[1]}; got {v0!r}.")
    return y / np.linalg.norm(y, axis=1, keepdims=True), v0 / np.linalg.norm(v0)


def householder_gauges(targets, v0) -> np.ndarray:
    """Reflections ``Q_i = I − 2 w wᵀ/|w|²``, ``w = g_i − v_0``, so that ``Q_i g_i = v_0``.

    (``w⟨w, g⟩ = w|w|²/2`` for unit ``g, v_0``, hence ``Q g = g − w = v_0``.) For ``g_i = v_0``
    (``w = 0``) ``Q_i = I``. Each ``Q_i`` is an improper (det −1) orthogonal matrix except there.
    """
    g, v0 = _unit_rows(targets, v0, "householder_gauges")
    w = g - v0
    norm = np.linalg.norm(w, axis=1, keepdims=True)
    w_hat = np.where(norm > 0, w / np.where(norm > 0, norm, 1.0), 0.0)
    return np.eye(g.shape[1]) - 2.0 * np.einsum("ni,nj->nij", w_hat, w_hat)


def _half_turn(v0: np.ndarray) -> np.ndarray:
    """A rotation by π in the plane ``(v_0, e)`` (``e`` ⊥ ``v_0`` from the least aligned axis)."""
    e = np.eye(v0.size)[np.argmin(np.abs(v0))]
    e = e - (e @ v0) * v0
    e /= np.linalg.norm(e)
    return np.eye(v0.size) - 2.0 * np.outer(v0, v0) - 2.0 * np.outer(e, e)


def rotation_gauges(targets, v0) -> np.ndarray:
    """Proper rotations ``Q_i = I + K + K²/(1 + ⟨g_i, v_0⟩)``, ``K = v_0 g_iᵀ − g_i v_0ᵀ``, with
    ``Q_i g_i = v_0``: the rotation in the plane ``span(g_i, v_0)`` by their angle (``Q = I`` at
    ``g = v_0``).

    ``1 + ⟨g, v_0⟩`` is computed as ``|g + v_0|²/2`` (no cancellation near ``g = −v_0``). At
    ``g = −v_0`` the formula is ``0/0`` and the rotation is not unique (any half-turn in a plane
    through ``v_0``); no choice is continuous there (the map ``g ↦ Q`` would be a section of
    ``SO(d) → S^{d−1}``, which is discontinuous somewhere). We take the half-turn in the plane of
    ``v_0`` and its least aligned coordinate axis. Near ``−v_0`` the result is accurate to about
    ``1e-16/|g + v_0|``.
    """
    g, v0 = _unit_rows(targets, v0, "rotation_gauges")
    d = g.shape[1]
    k = np.einsum("i,nj->nij", v0, g) - np.einsum("ni,j->nij", g, v0)
    one_plus = 0.5 * np.sum((g + v0) ** 2, axis=1)
    antipodal = one_plus == 0.0
    scale = 1.0 / np.where(antipodal, 1.0, one_plus)
    q = np.eye(d) + k + np.einsum("nij,njk->nik", k, k) * scale[:, None, None]
    q[antipodal] = _half_turn(v0)
    return q


# --------------------------------------------------------------------------- constructions and results


@dataclasses.dataclass(frozen=True)
class RealisationResult:
    """What a realisation reached, measured against its target and its bound."""

    x: np.ndarray  # (n, d) final content
    u_star: np.ndarray  # (d,) gauge-frame base point normalise(mean Q_i x_i)
    distance: float  # circular KS (orbit) or max_i |x_i − g(ξ_i)| (sphere)
    bound: float  # 1/(2n) (orbit) or 2|u* − v_0| (sphere)
    orbit_residual: float  # max_i |x_i − Q_iᵀ u*|
    wasserstein: float | None  # sphere: exact W1 (geodesic) to the targets; None for orbits / large n
    relative_angles: np.ndarray | None  # orbit: az(x_i) − az(u*) mod 2π
    trajectory: Trajectory


@dataclasses.dataclass(frozen=True)
class Construction:
    """A realisation set up and not yet run: kernel (gauge, ``w = 1``, exp profile), initial data
    ``x0`` (``(n, d)``, or ``(B, n, d)`` for a batch of seeds), labels ``ξ_i = (i+½)/n``, and the
    target (an angle law, or ``(n, d)`` points and ``v_0``)."""

    kind: str  # "orbit" | "sphere"
    kernel: Kernel
    x0: jax.Array
    xi: np.ndarray
    law: Any = None  # orbit
    targets: np.ndarray | None = None  # sphere
    v0: np.ndarray | None = None  # sphere

    @property
    def reference(self) -> np.ndarray:
        """The gauge-frame point whose orbit is the target: ``v_0`` (sphere), ``e_1`` (orbit)."""
        return self.v0 if self.kind == "sphere" else np.eye(self.kernel.gauge.d)[0]


def _midpoints(n: int) -> np.ndarray:
    return (np.arange(n) + 0.5) / n


def check_mode(mode, where: str = "realize") -> str:
    if mode not in MODES:
        close = difflib.get_close_matches(str(mode), MODES, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"{where}: `mode` must be one of {MODES}; got {mode!r}.{hint}")
    return mode


def _seeds(seed, where: str) -> tuple[int, ...] | None:
    """``None`` for one integer seed, else the tuple of a sequence's seeds (a batch)."""
    if isinstance(seed, int | np.integer) and not isinstance(seed, bool):
        return None
    seeds = tuple(seed) if isinstance(seed, list | tuple) else ()
    if not seeds or not all(isinstance(s, int | np.integer) and not isinstance(s, bool) for s in seeds):
        raise ValueError(
            f"{where}: `seed` must be an integer or a non-empty sequence of integers; got {seed!r}."
        )
    return tuple(int(s) for s in seeds)


def _initial(seed, sample, where: str) -> jax.Array:
    """``sample(seed)`` for one seed; the stack ``(B, n, d)`` for a sequence of seeds."""
    seeds = _seeds(seed, where)
    return sample(int(seed)) if seeds is None else jnp.stack([sample(s) for s in seeds])


def check_n(n, where: str = "realize", name: str = "n") -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 2:
        raise ValueError(f"{where}: `{name}` must be an integer >= 2; got {n!r}.")
    return int(n)


def orbit_construction(
    ppf_or_law, *, n: int = 256, beta: float = 1.0, seed: int | Sequence[int] = 0
) -> Construction:
    """Orbit universality in d = 3: :func:`orbit_gauge` of :func:`orbit_angles`, iid uniform initial
    data (one seed: ``x0 (n, 3)``; a sequence of seeds: the batch ``x0 (B, n, 3)``)."""
    n = check_n(n, "realize_orbit")
    law = as_angle_law(ppf_or_law)
    alpha = orbit_angles(law, n)
    if not np.all(np.isfinite(alpha)):
        raise ValueError("realize_orbit: `ppf_or_law` must give finite quantiles on (0, 1); got non-finite.")
    kernel = Kernel(gauge=orbit_gauge(alpha, 3), factor=NoFactor(n=n), profile=make_profile("exp", beta=beta))
    x0 = _initial(seed, lambda s: sphere.sample_uniform(s, n, 3), "realize_orbit")
    return Construction(kind="orbit", kernel=kernel, x0=x0, xi=_midpoints(n), law=law)


def sphere_construction(
    targets,
    *,
    v0=None,
    gauge: str = "householder",
    sigma: float = 0.2,
    beta: float = 1.0,
    seed: int | Sequence[int] = 0,
) -> Construction:
    """Points on the sphere: gauges with ``Q_i y_i = v_0``, initial data in a cap of width ``sigma``
    around ``v_0`` in the gauge frame (one seed, or a batch ``(B, n, d)`` for a sequence of seeds)."""
    y = check_sphere_targets(targets, name="targets", where="realize_sphere")
    n, d = y.shape
    v0 = np.eye(d)[-1] if v0 is None else np.asarray(v0, dtype=np.float64)
    if gauge not in GAUGES:
        close = difflib.get_close_matches(str(gauge), GAUGES, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"realize_sphere: `gauge` must be one of {GAUGES}; got {gauge!r}.{hint}")
    if not sigma > 0:
        raise ValueError(f"realize_sphere: `sigma` must be > 0; got {sigma!r}.")
    builder = householder_gauges if gauge == "householder" else rotation_gauges
    q = check_orthogonal(builder(y, v0), name="realize_sphere")
    v0 = v0 / np.linalg.norm(v0)
    dense = DenseGauge(q=jnp.asarray(q))
    kernel = Kernel(gauge=dense, factor=NoFactor(n=n), profile=make_profile("exp", beta=beta))
    x0 = _initial(
        seed,
        lambda s: dense.apply_transpose(sphere.sample_cap(s, n, jnp.asarray(v0), sigma=sigma)),
        "realize_sphere",
    )
    return Construction(kind="sphere", kernel=kernel, x0=x0, xi=_midpoints(n), targets=y, v0=v0)


def rotation_to(u_star, reference) -> np.ndarray:
    """A rotation ``R (d, d)`` with ``R u* = reference`` (both normalised; :func:`rotation_gauges`)."""
    u_star = np.asarray(u_star, dtype=np.float64).reshape(1, -1)
    return rotation_gauges(u_star, reference)[0]


def frame_kernel(kernel: Kernel) -> Kernel:
    """The kernel with the identity gauge (``x = u``): the gauge-frame dynamics."""
    return dataclasses.replace(kernel, gauge=IdentityGauge(kernel.gauge.n, kernel.gauge.d))


def exact_initial(construction: Construction, u_star) -> jax.Array:
    """The exact mode's initial content: ``x_0 = Qᵀ(R u_0)`` with ``u_0 = Q x_0`` the construction's
    gauge frame and ``R`` (:func:`rotation_to`) taking ``u*`` (``(d,)``, or ``(B, d)`` for a batch:
    the consensus the gauge frame reached from ``u_0``) to the reference point (module doc)."""
    gauge, x0 = construction.kernel.gauge, jnp.asarray(construction.x0)
    u_star = np.asarray(u_star, dtype=np.float64)

    def one(x, v):
        r = jnp.asarray(rotation_to(v, construction.reference), dtype=x.dtype)
        return gauge.apply_transpose(gauge.apply(x) @ r.T)

    if x0.ndim == 2:
        return one(x0, u_star)
    return jnp.stack([one(x, v) for x, v in zip(x0, u_star, strict=True)])


def _azimuth(x: np.ndarray) -> np.ndarray:
    return np.arctan2(x[..., 1], x[..., 0])


def measure_realisation(construction: Construction, trajectory: Trajectory) -> RealisationResult:
    """Measure the final state of a realisation's ``trajectory`` against the construction's target.

    Orbit: the relative angles ``az(x_i) − az(u*)`` mod 2π, their circular KS distance to the law,
    bound ``1/(2n)``. Sphere: ``max_i |x_i − y_i|``, bound ``2|u* − v_0|``, the exact W1 (up to
    ``WASSERSTEIN_MAX_N`` points). Both: the base point ``u*`` and the orbit residual.
    """
    x = np.asarray(trajectory.xs[-1])
    q = np.asarray(construction.kernel.gauge.matrices())
    u_star = np.asarray(metrics.orbit_base_point(x, q))
    residual = float(metrics.orbit_residual(x, q))
    n = x.shape[0]
    if construction.kind == "orbit":
        relative = np.mod(_azimuth(x) - _azimuth(u_star), TWO_PI)
        return RealisationResult(
            x=x,
            u_star=u_star,
            distance=metrics.circular_ks(relative, construction.law.cdf),
            bound=1.0 / (2.0 * n),
            orbit_residual=residual,
            wasserstein=None,
            relative_angles=relative,
            trajectory=trajectory,
        )
    y = construction.targets
    return RealisationResult(
        x=x,
        u_star=u_star,
        distance=float(metrics.max_pointwise_distance(x, y)),
        bound=2.0 * float(np.linalg.norm(u_star - construction.v0)),
        orbit_residual=residual,
        wasserstein=metrics.wasserstein_sphere(x, y) if n <= WASSERSTEIN_MAX_N else None,
        relative_angles=None,
        trajectory=trajectory,
    )


# --------------------------------------------------------------------------- validation of targets


def check_sphere_targets(y, *, name: str = "targets", where: str = "realize") -> np.ndarray:
    """``y`` as float64 unit rows ``(n, d)``, ``n, d >= 2``, after checking shape, finiteness and
    ``|‖y_i‖ − 1| <= 1e-6`` (then normalised exactly)."""
    y = np.asarray(y)
    if y.ndim != 2 or y.shape[0] < 2 or y.shape[1] < 2 or not np.issubdtype(y.dtype, np.number):
        raise ValueError(
            f"{where}: `{name}` must be an (n, d) array of unit vectors with n, d >= 2; "
            f"got shape {y.shape} and dtype {y.dtype}."
        )
    y = y.astype(np.float64)
    if not np.all(np.isfinite(y)):
        bad = int(np.sum(~np.all(np.isfinite(y), axis=1)))
        raise ValueError(f"{where}: `{name}` must be finite everywhere; got {bad} rows with NaN or inf.")
    defect = np.abs(np.linalg.norm(y, axis=1) - 1.0)
    worst = int(np.argmax(defect))
    if defect[worst] > UNIT_TOL:
        raise ValueError(
            f"{where}: `{name}` must hold unit vectors (| |y_i| - 1 | <= {UNIT_TOL:g}); "
            f"got |y_{worst}| = {np.linalg.norm(y[worst]):.6g}."
        )
    return y / np.linalg.norm(y, axis=1, keepdims=True)


def check_orbit_samples(a, *, name: str = "samples", where: str = "realize") -> np.ndarray:
    """``a`` as float64 ``(m,)`` finite angles (radians, any real values), ``m >= 2``."""
    a = np.asarray(a)
    if a.ndim != 1 or a.shape[0] < 2 or not np.issubdtype(a.dtype, np.number):
        raise ValueError(
            f"{where}: `{name}` must be an (n,) array of angles (radians) with n >= 2; "
            f"got shape {a.shape} and dtype {a.dtype}."
        )
    a = a.astype(np.float64)
    if not np.all(np.isfinite(a)):
        raise ValueError(
            f"{where}: `{name}` must be finite everywhere; got {int(np.sum(~np.isfinite(a)))} NaN/inf."
        )
    return a
