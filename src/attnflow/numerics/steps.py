"""Step-size policies: how long each step of a run is (diffrax's step-size controllers).

A policy advances one run from one snapshot time to the next (``advance``), carrying its own state
between snapshots (``init(method, x0)``). The run's state ``x`` is an ``(n, d)`` array of particles
or any pytree of arrays (a density): the policies only add, compare and test it leaf by leaf, and
the method's retraction is the only geometry (``attnflow.numerics.integrators``). Times and steps
are in the real dtype of the state (float64 for complex coefficients).

- ``ConstantSteps(dt)``: ``save_every / dt`` steps of ``dt`` (a ``lax.scan``), with the noise and
  stochastic fields that need a fixed grid. The state carried is nothing.
- ``AdaptiveSteps(rtol, atol, ..., controller=PIController())``: trial steps of a method with
  first-same-as-last stages, an embedded error estimate and a dense output (``Adaptive``:
  ``fsal_step``, ``interpolate``). A trial step is accepted when its scaled error is at most 1;
  the controller (``PIController.adapt``) sets the next step from this error and the previous
  accepted one. A rejected step (error above 1, or not finite) is retried shorter. The steps do not
  land on snapshot times: the run steps past each one and the snapshot is interpolated. The state
  carried is the integration state (its time, point, slope, last accepted step and its slopes, the
  previous error); at most ``max_steps`` trial steps per snapshot.

Three objects, as diffrax's: the method steps (and estimates its error), the controller
(``PIController``) only adapts the step, the loop (``attnflow.numerics.solve.advance``) only goes
from snapshot to snapshot.

``advance`` (given ``active``, False for a run that has stopped) returns
``(x, key, state, stats, code)``: ``x`` the snapshot, ``stats`` the int32 counts
``(accepted, rejected, field evaluations)`` of this chunk, ``code`` the ``Status`` code (ok; a
non-finite state; out of steps: ``max_steps``, or ``nonfinite`` when the last trial step was not
finite).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.core.pytree import pytree_dataclass
from attnflow.numerics.dynamics import noise_increment
from attnflow.numerics.saving import whole_multiple
from attnflow.numerics.status import Status

_OK, _NONFINITE, _MAX_STEPS = Status.ok.code, Status.nonfinite.code, Status.max_steps.code


def time_dtype(x):
    """The dtype of times and steps for the state ``x`` (an array or a pytree): the real dtype of
    its leaves (``x.dtype`` for a real array)."""
    return jnp.result_type(*(jnp.finfo(leaf.dtype).dtype for leaf in jax.tree.leaves(x)))


def all_finite(x) -> jax.Array:
    """Whether every entry of every leaf of the state ``x`` is finite (a boolean scalar)."""
    finite = [jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(x)]
    return functools.reduce(jnp.logical_and, finite)


def is_stochastic(field) -> bool:
    """A stochastic field is called ``field(x, key)`` (a fresh key each step: ``random_batch``)."""
    return bool(getattr(field, "stochastic", False))


def check_retraction(method, field) -> None:
    """A field that says where its state lives (``field.retraction``: ``"none"`` for a pre- or
    peri-LN state ``z`` in ``R^d``) is stepped with that retraction: the sphere's would normalise
    ``z`` after every step and run the post-LN dynamics instead, silently."""
    wanted = getattr(field, "retraction", None)
    if not isinstance(wanted, str) or wanted == method.retraction:
        return
    fix = (
        "geodesic_rk4 steps on the sphere only: use euler, rk4 or adaptive"
        if getattr(method, "geodesic", False)
        else f"pass integrator={type(method).__name__}(retraction=field.retraction)"
    )
    raise ValueError(
        f"solve: `integrator.retraction` must be the field's, {wanted!r}; got {method.retraction!r} ({fix})."
    )


def check_particles(field, x0, batched: bool, *, where: str) -> None:
    """The tokens of an attention field (a kernel's or heads', a layer norm's included): ``x0`` real
    floats of shape ``(n, d)`` (a batch ``(B, n, d)``) for the field's ``n`` tokens in its ``d``
    dimensions; a mismatch is one line here instead of a broadcasting error inside JAX, or none at all."""
    layer = getattr(field, "layer", field)
    kernel, heads = getattr(layer, "kernel", None), getattr(layer, "heads", None)
    if kernel is not None:
        n, d = getattr(kernel, "n", None), getattr(kernel.gauge, "d", None)
        owner, float32 = "the kernel's", "a float32 kernel"
    elif heads:
        n, d = getattr(heads[0], "n", None), getattr(heads[0], "d", None)
        owner, float32 = "the heads'", "float32 heads"
    else:
        return
    if not (isinstance(n, int) and isinstance(d, int) and isinstance(x0, jax.Array | np.ndarray)):
        return
    if x0.shape[batched:] != (n, d):
        shape = "(B, n, d)" if batched else "(n, d)"
        raise ValueError(
            f"{where}: `x0` must have shape {shape} with (n, d) = ({n}, {d}), {owner}; got {x0.shape}."
        )
    if not jnp.issubdtype(x0.dtype, jnp.floating):
        raise ValueError(
            f"{where}: `x0` must hold real floats (float64, or float32 with {float32}); got {x0.dtype}."
        )


def make_step(method, field, noise: float):
    """``step(x, key, h) -> (x, key)``: one step of ``method``, with the field's key (a stochastic
    field draws from a fresh key each step, shared by its stages) and the noise increment
    ``sqrt(2·noise·h) P_x dW`` followed by renormalisation. ``h`` may be a traced float64 scalar
    (a program argument): the stages take it in the state's real dtype (``time_dtype``), as they
    would a Python float. The noise is the particles' (an ``(n, d)`` state)."""
    stochastic = is_stochastic(field)

    def step(x, key, dt):
        h = jnp.asarray(dt, time_dtype(x))
        if stochastic:
            key, sub_field, sub_noise = jax.random.split(key, 3)
            x = method.step(lambda y: field(y, sub_field), x, h)
        else:
            if noise > 0:
                key, sub_noise = jax.random.split(key)
            x = method.step(field, x, h)
        if noise > 0:
            x = method.retract(x + noise_increment(sub_noise, x, noise=noise, dt=dt))
        return x, key

    return step


@pytree_dataclass(data_fields=["dt"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class ConstantSteps:
    """Fixed steps of ``dt`` (``save_every`` must be a whole multiple of it). A pytree whose leaf is
    ``dt``: inside ``solve``'s program ``dt`` and ``save_every`` are arguments, so runs at another
    step or snapshot interval reuse the compiled program."""

    dt: float

    def __post_init__(self) -> None:
        if not self.dt > 0:
            raise ValueError(f"ConstantSteps: `dt` must be positive; got {self.dt!r}.")

    def steps_per_save(self, save_every: float) -> int:
        return whole_multiple("save_every", save_every, "dt", self.dt)

    def check(self, method, field, *, noise: float, save_every: float) -> None:  # noqa: ARG002
        check_retraction(method, field)
        self.steps_per_save(save_every)

    def evaluations_per_save(self, method, save_every: float) -> int:
        """Field evaluations between two snapshots (to size the compiled calls)."""
        return self.steps_per_save(save_every) * len(method.tableau.b)

    def init(self, method, x):  # noqa: ARG002
        return ()

    def advance(self, method, field, x, key, state, t_target, *, active, noise: float, save_every: float):  # noqa: ARG002
        """``save_every / dt`` steps (``t_target`` is implied by the count; computed even when not
        ``active``: the caller discards them). ``dt`` and ``save_every`` may be traced: the count is
        then the rounded ratio, which ``check`` made sure is whole on the host."""
        step = make_step(method, field, noise)
        if isinstance(self.dt, float) and isinstance(save_every, float):
            count = self.steps_per_save(save_every)
        else:
            count = jnp.rint(jnp.asarray(save_every, jnp.float64) / self.dt).astype(jnp.int32)

        x, key = jax.lax.fori_loop(0, count, lambda _, carry: step(*carry, self.dt), (x, key))
        stats = jnp.stack([count, 0, count * len(method.tableau.b)]).astype(jnp.int32)
        code = jnp.where(all_finite(x), _OK, _NONFINITE).astype(jnp.int32)
        return x, key, state, stats, code


@dataclasses.dataclass(frozen=True)
class PIController:
    """Proportional–integral step-size control (diffrax's ``PIDController`` without the derivative
    term): after an accepted trial step ``h`` with scaled error ``e`` (previous accepted error
    ``e_prev``) the next step is ``h · clip(safety · e^(−(pcoeff+icoeff)/k) · e_prev^(pcoeff/k),
    factor_min, factor_max)``, ``k`` the method's order; after a rejected one,
    ``h · clip(safety · e^(−1/k), factor_min, 1)`` (``factor_min`` when ``e`` is not finite).
    ``pcoeff = 0, icoeff = 1`` is the classical integral controller; the defaults are Hairer's
    DOPRI5 values (exponents 0.17 and 0.04 at k = 5)."""

    pcoeff: float = 0.2
    icoeff: float = 0.65
    safety: float = 0.9
    factor_min: float = 0.2
    factor_max: float = 10.0

    def __post_init__(self) -> None:
        for name in ("pcoeff", "icoeff"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"PIController: `{name}` must be >= 0; got {getattr(self, name)!r}.")
        if not 0 < self.safety <= 1:
            raise ValueError(f"PIController: `safety` must be in (0, 1]; got {self.safety!r}.")
        if not 0 < self.factor_min < 1 < self.factor_max:
            raise ValueError(
                f"PIController: `factor_min` and `factor_max` must satisfy 0 < factor_min < 1 < "
                f"factor_max; got {(self.factor_min, self.factor_max)!r}."
            )

    def adapt(self, h, error_norm, error_prev, order: int):
        """``(accept, next step, error to remember)`` after a trial step ``h``."""
        finite = jnp.isfinite(error_norm)
        e = jnp.where(finite, jnp.maximum(error_norm, 1e-10), 1.0)
        accept = finite & (error_norm <= 1.0)
        grow = self.safety * e ** (-(self.pcoeff + self.icoeff) / order) * error_prev ** (self.pcoeff / order)
        shrink = jnp.where(finite, self.safety * e ** (-1.0 / order), self.factor_min)
        factor = jnp.where(
            accept, jnp.clip(grow, self.factor_min, self.factor_max), jnp.clip(shrink, self.factor_min, 1.0)
        )
        return accept, h * factor, jnp.where(accept, jnp.maximum(e, 1e-4), error_prev)


@pytree_dataclass(
    data_fields=["rtol", "atol", "dt0"], meta_fields=["max_steps", "max_steps_total", "controller"]
)
@dataclasses.dataclass(frozen=True)
class AdaptiveSteps:
    """Error-controlled steps of a method with an embedded pair and a dense output, from a first
    trial step ``dt0``; ``controller`` sets each next step. At most ``max_steps`` trial steps per
    snapshot and ``max_steps_total`` in all (None: no bound but the first). A pytree whose leaves
    are the tolerances and ``dt0``: runs at other tolerances reuse the compiled program."""

    rtol: float = 1e-8
    atol: float = 1e-10
    dt0: float = 1e-2
    max_steps: int = 1_000_000  # trial steps per snapshot
    controller: PIController = PIController()
    max_steps_total: int | None = None  # trial steps of the whole run

    def __post_init__(self) -> None:
        for name in ("rtol", "atol", "dt0"):
            if not getattr(self, name) > 0:
                raise ValueError(f"AdaptiveSteps: `{name}` must be positive; got {getattr(self, name)!r}.")
        for name in ("max_steps", "max_steps_total"):
            value = getattr(self, name)
            if value is None and name == "max_steps_total":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**31:
                raise ValueError(f"AdaptiveSteps: `{name}` must be an integer in [1, 2^31); got {value!r}.")

    def check(self, method, field, *, noise: float, save_every: float) -> None:  # noqa: ARG002
        if not hasattr(method, "fsal_step"):
            raise ValueError(
                f"solve: `integrator` must have an embedded error estimate (adaptive) for AdaptiveSteps; "
                f"got {type(method).__name__}."
            )
        check_retraction(method, field)
        if noise > 0:
            raise ValueError(
                "solve: `noise` > 0 needs a fixed-step method (euler, rk4, geodesic_rk4); got adaptive."
            )
        if is_stochastic(field):
            raise ValueError(
                "solve: a stochastic `field` (random batches) needs a fixed-step method (euler, rk4, "
                "geodesic_rk4); got adaptive."
            )

    def evaluations_per_save(self, method, save_every: float) -> int:  # noqa: ARG002
        """Unknown in advance: a low estimate, one trial step per snapshot (to size the compiled
        calls only; long steps pass several snapshots)."""
        return len(method.tableau.b) - 1

    def init(self, method, x):
        """The state at t = 0: no step taken yet (the first slope is evaluated by the first
        ``advance``). Its constants are NumPy arrays: made on the host, they compile nothing. The
        slope ``k`` and the step's ``slopes`` have the state's structure (``slopes``: every leaf
        stacked over the method's stages)."""
        real = time_dtype(x)
        zero = np.zeros((), real)
        stages = len(method.tableau.b)
        k = jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), x)
        slopes = jax.tree.map(lambda leaf: np.zeros((stages, *leaf.shape), leaf.dtype), x)
        return dict(
            h=np.asarray(self.dt0, real), t=zero, x=x, k=k, x_last=x, t_last=zero,
            h_last=np.asarray(self.dt0, real), slopes=slopes, error_prev=np.ones((), real),
            started=np.zeros((), bool), taken=np.zeros((), np.int32),
        )  # fmt: skip

    def trial(self, method, field, s, *, first_stage, running=True):
        """One trial step from the loop state ``s`` (the keys of :meth:`init`): ``(s, accept,
        error)``. An accepted step moves the run on (time, state, the step's dense-output data and
        the controller's memory); the next step size and first slope are set either way, the step
        size only while ``running`` (False: a trial past the end, computed and discarded, as in
        :func:`attnflow.numerics.differentiable.integrate_adaptive`)."""
        x_new, slopes, error = method.fsal_step(
            field, s["x"], s["k"], s["h"], rtol=self.rtol, atol=self.atol, first_stage=first_stage
        )
        accept, h_next, error_prev = self.controller.adapt(s["h"], error, s["error_prev"], method.order)
        accept = running & accept
        moved = dict(
            t=s["t"] + s["h"], x=x_new, x_last=s["x"], t_last=s["t"], h_last=s["h"], slopes=slopes,
            error_prev=error_prev,
        )  # fmt: skip
        s = {
            **s,
            **jax.tree.map(lambda new, old: jnp.where(accept, new, old), moved, {n: s[n] for n in moved}),
            "h": jnp.where(running, h_next, s["h"]),
            "k": jax.tree.map(lambda stacked: jnp.where(accept, stacked[-1], stacked[0]), slopes),
        }
        return s, accept, error

    def advance(self, method, field, x, key, state, t_target, *, active, noise: float, save_every: float):  # noqa: ARG002
        """Trial steps until the integration time passes ``t_target`` (or ``max_steps`` of them;
        none unless ``active``), then the snapshot from the dense output of the last step."""
        stages = len(method.tableau.b)

        total = np.int32(2**31 - 1 if self.max_steps_total is None else self.max_steps_total)

        def cond(loop):
            s, counts, _ = loop
            trials = counts[0] + counts[1]
            return active & (s["t"] < t_target) & (trials < self.max_steps) & (s["taken"] + trials < total)

        def body(loop):
            s, counts, _ = loop
            first = jnp.where(s["started"], 1, 0)  # a run's first trial also evaluates its first slope
            s, accept, err = self.trial(method, field, s, first_stage=first)
            s = {**s, "started": jnp.asarray(True)}
            counts = counts + jnp.stack([accept, ~accept, stages - first]).astype(jnp.int32)
            return s, counts, ~jnp.isfinite(err)

        s, counts, broken = jax.lax.while_loop(
            cond, body, (state, jnp.zeros(3, jnp.int32), jnp.asarray(False))
        )
        s = {**s, "taken": s["taken"] + counts[0] + counts[1]}
        theta = (t_target - s["t_last"]) / s["h_last"]
        snapshot = method.interpolate(s["x_last"], s["slopes"], s["h_last"], theta)
        reached = s["t"] >= t_target
        code = jnp.where(reached, _OK, jnp.where(broken, _NONFINITE, _MAX_STEPS)).astype(jnp.int32)
        return snapshot, key, s, counts, code


StepPolicy = ConstantSteps | AdaptiveSteps
