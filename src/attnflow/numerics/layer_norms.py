"""Layer norms in continuous time: where a layer's normalisation puts the attention output ``A_i``.

With ``A_i(x)`` the attention of a layer (:class:`~attnflow.numerics.dynamics.AttentionField` or
:class:`~attnflow.numerics.heads_field.HeadsField`, their ``attention(x)``), tokens ``z_i ∈ R^d``,
``x_i = z_i/|z_i|``, ``r_i = |z_i|``, ``r_i(0) = 1``:

- ``post`` (the paper's model): ``dx_i/dt = P_{x_i} A_i``, on the sphere.
- ``pre``:  ``dz_i/dt = A_i(x)``, so ``dx_i/dt = P_{x_i} A_i / r_i`` and ``dr_i/dt = ⟨x_i, A_i⟩``.
- ``peri``: ``dz_i/dt = A_i/|A_i|``, so ``dx_i/dt = P_{x_i} A_i / (r_i |A_i|)`` and
  ``dr_i/dt = ⟨x_i, A_i⟩/|A_i|``.
- ``ngpt``: ``dx_i/dt = α P_{x_i}(A_i/|A_i|)``, on the sphere.

``pre`` and ``peri`` evolve ``z`` in ``R^d`` (the integrator's ``retraction="none"``: ``retraction``
says which); ``post`` and ``ngpt`` evolve ``x`` on the sphere. All four move each token's direction
along the same ``P_{x_i} A_i`` and differ in its speed: pre-LN slows a token as its radius grows,
peri-LN and nGPT move at a speed independent of the size of ``A_i`` (speed regulation, as in
Karagodin, Ge, Polyanskiy and Rigollet, "Normalization in Attention Dynamics"). A token whose
attention output is exactly zero does not move under ``peri`` and ``ngpt`` (``A/|A|`` is taken as 0
there: the direction is undefined and the limit from any side is bounded). Held sources never move.

Each norm turns every token along its own component of ``P_{x_i} A_i`` at a positive speed factor
(``1/r_i``, ``1/(r_i |A_i|)``, ``α/|A_i|``), so where the layer is a gradient flow of its energy
``E`` (post-LN), ``E`` of the directions is non-decreasing under every norm
(``dE/dt = (1/n) Σ_i s_i |P_{x_i} A_i|²``, ``s_i`` the speed factor): ``energy_ascends``.
Only post-LN is the gradient flow itself (``gradient_flow``).

A run stores the directions ``x`` and, for pre and peri, the radii ``r`` (``split_state``), and
continues each snapshot from ``z = r x`` (``join_state``): :func:`solve_radial` advances a pre- or
peri-LN layer one snapshot at a time that way, so that the state at every snapshot is exactly the
stored one and a run continued from its store is bitwise the run that never stopped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.core.pytree import pytree_field
from attnflow.core.sphere import normalize, project
from attnflow.numerics.heads_field import hold_sources
from attnflow.numerics.integrators import Integrator
from attnflow.numerics.saving import SaveAt, snapshot_count
from attnflow.numerics.solve import SolveStatistics, Status, solve_streaming

LAYER_NORMS = ("post", "pre", "peri", "ngpt")
RADIAL = ("pre", "peri")  # the norms whose tokens z live in R^d, with a radius r = |z|


def _unit(a: jax.Array) -> jax.Array:
    """``a/|a|`` row by row, 0 where ``a = 0``."""
    norm = jnp.linalg.norm(a, axis=-1, keepdims=True)
    return a / jnp.where(norm > 0, norm, 1.0)


@pytree_field(data_fields=["layer"])
@dataclasses.dataclass(frozen=True, eq=False)
class LayerNormField:
    """``layer`` (a field with ``attention(x)`` and ``sources``) under the layer norm ``kind``; called
    on the state (``z`` for pre and peri, ``x`` for post and ngpt), it returns the state's velocity."""

    layer: Any
    kind: str = "post"
    alpha: float = 1.0  # nGPT's step scale

    def __post_init__(self) -> None:
        if self.kind not in LAYER_NORMS:
            raise ValueError(f"layer norm: `layer_norm` must be one of {LAYER_NORMS}; got {self.kind!r}.")
        if not (isinstance(self.alpha, int | float) and self.alpha > 0):
            raise ValueError(f"layer norm: `ngpt_alpha` must be a positive number; got {self.alpha!r}.")

    @property
    def numbers_traceable(self) -> bool:
        return getattr(self.layer, "numbers_traceable", True)

    @property
    def retraction(self) -> str:
        """The integrator's retraction for this state: ``"none"`` for ``z``, ``"sphere"`` for ``x``."""
        return "none" if self.kind in ("pre", "peri") else "sphere"

    @property
    def radial(self) -> bool:
        """Whether the state is ``z`` in ``R^d`` (pre, peri), with a radius per token."""
        return self.kind in RADIAL

    @property
    def gradient_flow(self) -> bool:
        """Whether ``v = n P_x ∇E``: post-LN of a gradient-flow layer only."""
        return self.kind == "post" and self.layer.gradient_flow

    @property
    def energy_ascends(self) -> bool:
        """Whether ``E`` of the directions is non-decreasing: under every norm, for a layer that is
        a gradient flow (each token moves along its own gradient at a positive speed factor)."""
        return bool(self.layer.gradient_flow)

    @property
    def interaction(self) -> str:
        return self.layer.interaction

    @property
    def rank(self) -> int | None:
        return self.layer.rank

    @property
    def sources(self) -> int:
        return self.layer.sources

    def energy(self, x: jax.Array) -> jax.Array:
        """The layer's energy of the directions ``x``."""
        return self.layer.energy(x)

    def __call__(self, state: jax.Array) -> jax.Array:
        sources = self.layer.sources
        if self.kind == "post":
            return self.layer(state)
        x = state if self.kind == "ngpt" else normalize(state)
        a = self.layer.attention(x)
        if self.kind == "pre":
            return hold_sources(a, sources)
        if self.kind == "peri":
            return hold_sources(_unit(a), sources)
        return hold_sources(self.alpha * project(x, _unit(a)), sources)


def directions_and_radii(states: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(x, r)``: the tokens' directions and radii of states ``z (..., n, d)``."""
    r = jnp.linalg.norm(states, axis=-1)
    return states / r[..., None], r


def split_state(z) -> tuple[np.ndarray, np.ndarray]:
    """``(x, r)``: the directions ``z/|z|`` and radii ``|z|`` of states ``z (..., n, d)``, in NumPy
    at ``z``'s dtype (what a run stores)."""
    z = np.asarray(z)
    r = np.sqrt(np.einsum("...d,...d->...", z, z))
    return z / r[..., None], r


def join_state(x, r) -> np.ndarray:
    """``z = r x``: the states of directions ``x (..., n, d)`` and radii ``r (..., n)``."""
    return np.asarray(x) * np.asarray(r)[..., None]


RadialSink = Callable[[int, np.ndarray, np.ndarray], None]  # (k, x (n, d), r (n,)), k = 1, 2, ...


def solve_radial(
    field: LayerNormField,
    x0,
    r0,
    *,
    on_snapshot: RadialSink,
    integrator: Integrator,
    dt: float,
    t_end: float,
    save_every: float,
) -> SolveStatistics:
    """Fixed steps of a pre- or peri-LN ``field`` from the directions ``x0 (n, d)`` and radii
    ``r0 (n,)`` to ``t_end``, one snapshot at a time: snapshot ``k`` (at ``k · save_every``) goes to
    ``on_snapshot(k, x, r)`` as ``split_state(z)``, and the next one starts from
    ``join_state(x, r)``, as does the first (``x0`` and ``r0`` are not handed on). The state at
    every snapshot is thus exactly what a store of ``(x, r)`` keeps: continued from a stored
    snapshot, a run is bitwise the run that never stopped. Returns the status and step statistics
    of the whole solve; a snapshot whose split is not finite (a radius of 0) ends it unstored, with
    status ``nonfinite``."""
    if not (isinstance(field, LayerNormField) and field.radial):
        raise ValueError(f"solve_radial: `field` must be a pre- or peri-LN LayerNormField; got {field!r}.")
    x, r = np.asarray(x0), np.asarray(r0)
    totals = np.zeros(3, np.int64)  # accepted, rejected, evaluations
    steps, compile_time, status, delivered = 0, 0.0, Status.ok, 1
    for k in range(1, snapshot_count(t_end, save_every)):
        last: list[np.ndarray] = []
        result = solve_streaming(
            field,
            jnp.asarray(join_state(x, r)),
            on_snapshots=lambda ts, zs, last=last: last.extend(zs[np.asarray(ts) > 0]),
            integrator=integrator,
            dt=dt,
            saveat=SaveAt(save_every, save_every),
        )
        steps += result.steps
        compile_time += result.compile_time_s
        totals += [int(result.accepted), int(result.rejected), int(result.evaluations)]
        status = result.status
        if status != Status.ok:
            break
        x, r = split_state(last[-1])
        if not (np.isfinite(x).all() and np.isfinite(r).all()):
            status = Status.nonfinite
            break
        on_snapshot(k, x, r)
        delivered += 1
    return SolveStatistics(
        statuses=np.asarray(status, dtype=object),
        steps=steps,
        accepted=np.asarray(totals[0]),
        rejected=np.asarray(totals[1]),
        evaluations=np.asarray(totals[2]),
        compile_time_s=compile_time,
        snapshots=delivered,
    )
