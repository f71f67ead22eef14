"""The stationary states of a kernel's energy: multi-start search, deduplication, continuation.

``run_landscape(config, out, starts=K, continuation=...)`` writes a folder:

- ``states.csv``: one row per distinct stationary state, best (highest energy) first: ``state``,
  ``energy``, ``morse_index`` (ascent directions modulo rotations; 0 = strict local maximum),
  ``shape`` (``attnflow.analysis.shapes`` on the gauge frame, d = 3; else "unclassified"),
  ``gradient_norm``, ``symmetry_dim``, ``start`` (the first start that reached it), ``hits`` (how
  many did) and ``lambda_1 … lambda_8``, the top Hessian eigenvalues modulo rotations;
- ``states.npz``: ``x (S, n, d)``, ``energy``, ``morse_index``, ``xi``;
- ``landscape.json``: the config, the starts, how many converged, the continuation's transitions;
- with a continuation: ``branches.csv`` (``branch`` = the state followed, the parameter, energy,
  index, ``lambda_1``, gradient norm, shape), ``transitions.csv`` (``kind`` "index": where a
  branch's index changes, an eigenvalue crossing 0 located by a root search on that eigenvalue;
  ``kind`` "end": where Newton from the branch stops converging, a fold, located by bisection) and
  ``branches.png``. The key continued is checked like ``--set`` and refused for ``--continue``
  before any solve (:func:`with_value`): a value out of its bounds, a key that the config's chosen
  kind does not read (``factor.slope`` with a Toeplitz cosine factor: its branches would be flat),
  a value whose dynamics is not the gradient flow, ``model.n`` or ``model.d`` (a branch keeps the
  states' shape).

Starts (every one ends with Riemannian Newton, ``attnflow.analysis.landscape.newton``):

- closed-form candidates, always: the Dirac in the gauge frame (the orbit ``Q(ξ_i)ᵀv``, stationary
  for every kernel), and for a Toeplitz cosine factor the uniform great circle and the antipodal
  pair (``attnflow.analysis.theory``), taken as they are, plus the circle compressed onto arcs of
  0.6·2π and 0.75·2π, the antipodal pair spread into arcs, and a cluster opposite an arc, taken
  after the gradient flow;
- ``starts`` random ones (uniform, seeds ``seed … seed + starts − 1``) after the gradient flow
  (``solver`` of the config: method, ``dt``, ``t_end``); every second one annealed: half the time
  with noise (``ANNEAL_NOISE · c e^β``), then without.

The flows use the gradient flow of the energy (usa, non-causal, value "gradient"): the landscape is
that of ``E``, whatever normalisation, mask or value the config's dynamics use.

Deduplication modulo symmetry: two states are the same when their energies agree to
``ENERGY_RTOL``, their Morse indices agree and the singular values of their gauge frames agree to
``FRAME_TOL``: invariants of the rotations of the gauge frame and of any relabelling that maps the
kernel to itself (e.g. the cyclic shifts of ``ξ_i = i/n`` for the Toeplitz cosine).
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from collections.abc import Callable, Collection
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize

from attnflow.analysis import landscape, theory
from attnflow.analysis.shapes import classify_shape
from attnflow.core import factors, sphere
from attnflow.core.kernel import Kernel
from attnflow.io import run_folder
from attnflow.io.atomic import replacing, write_json, write_text
from attnflow.io.config import Config, ConfigError, apply_overrides, config_from_dict, resolved_dict
from attnflow.io.config_unused import check_unused
from attnflow.numerics.dynamics import make_vector_field
from attnflow.numerics.solve import solve
from attnflow.numerics.summation import energy
from attnflow.viz.landscape import write_branch_figure
from attnflow.workflows.build import Simulation, build

ENERGY_RTOL = 1e-9  # same state: energies within this (relative to max(1, |E|))
FRAME_TOL = 1e-6  # same state: singular values of the gauge frames within this
ANNEAL_NOISE = 0.02  # the annealed starts' noise, in units of c e^β (the field's scale)
ARC_FRACTIONS = (0.6, 0.75)
PAIR_SPREAD = 0.5  # radians: the antipodal pair spread into two arcs
# a cluster (the labels with |ωξ| < 0.34π) opposite an arc (the others, their phase compressed by
# 0.45): the start that reaches the highest stable antipodal-arcs state of D3 at n = 64 .. 256
CLUSTER_HALF_WIDTH, ARC_COMPRESSION = 0.34, 0.45
END_HALVINGS = 6  # a branch's end (Newton stops converging) located to step / 2^6
# Newton steps allowed along a branch: from the previous point's state Newton converges in a few
# steps (quadratically); more means the start is outside its basin, in practice at a fold
CONTINUATION_NEWTON = 12
N_EIGENVALUES = landscape.TOP_EIGENVALUES
ALIASES = {"beta": "model.beta", "omega": "factor.omega", "slope": "factor.slope"}
CONTINUE = "--continue"  # where a value set by the continuation is reported
SHAPE_KEYS = ("model.n", "model.d")  # not continued: they change the shape (n, d) of the states


@dataclasses.dataclass(frozen=True)
class State:
    """One stationary state and what is known of it."""

    x: np.ndarray
    energy: float
    morse_index: int
    eigenvalues: np.ndarray  # top Hessian eigenvalues modulo rotations, descending
    symmetry_dim: int
    gradient_norm: float
    shape: str
    start: str
    hits: int = 1


@dataclasses.dataclass(frozen=True)
class Continuation:
    """Follow every state in ``key`` over ``values`` (``KEY=START:STOP:STEP`` on the command line)."""

    key: str
    values: np.ndarray


def parse_continuation(spec: str) -> Continuation:
    """``"beta=0.5:5:0.1"`` (or any config key, e.g. ``factor.omega=1:7:0.5``) as a :class:`Continuation`."""
    match = re.fullmatch(r"\s*([\w.]+)\s*=\s*([^:]+):([^:]+):([^:]+)\s*", spec)
    try:
        start, stop, step = (float(v) for v in match.groups()[1:]) if match else (math.nan,) * 3
    except ValueError:
        start = stop = step = math.nan
    count = (stop - start) / step if step else math.nan
    if not match or not all(map(math.isfinite, (start, stop, step))) or not count > 0:
        raise ValueError(
            f"--continue: `KEY=START:STOP:STEP` must be a key and three numbers with STOP reached from "
            f"START in steps of STEP (e.g. beta=0.5:5:0.1); got {spec!r}."
        )
    key = ALIASES.get(match.group(1), match.group(1))
    values = start + step * np.arange(int(math.floor(count + 1e-9)) + 1)
    return Continuation(key=key, values=np.round(values, 12))


def with_value(config: Config, key: str, value: float) -> Config:
    """``config`` with ``key = value``, checked like ``--set`` and reported for ``--continue``: a
    bad value, a key that the config's chosen kind does not read (``factor.slope`` with a Toeplitz
    cosine factor: :func:`~attnflow.io.config_unused.check_unused`), a value whose dynamics is not
    the gradient flow (:func:`check_gradient_flow`). An integral value is written as an integer (an
    integer key takes it; a number key takes an integer too)."""
    written = repr(int(value)) if float(value).is_integer() else repr(float(value))
    data = apply_overrides(resolved_dict(config), [f"{key}={written}"], where=CONTINUE)
    result = config_from_dict(data, where=CONTINUE)
    section, _, name = key.partition(".")
    only = {section: {name: data[section][name]}}  # the key continued: the base was checked when read
    check_unused(only, result, where=CONTINUE, overridden={key}, override_where=CONTINUE)
    check_gradient_flow(result, overridden={key}, override_where=CONTINUE)
    return result


def check_gradient_flow(
    config: Config, *, where: str = "config", overridden: Collection[str] = (), override_where: str = "--set"
) -> None:
    """The landscape is that of the energy: refuse, naming the key, a config whose dynamics is not
    its gradient flow (heads, a causal mask, values outside the gradient, held sources), whose
    stationary states would not be those of the flow it describes. Reported for ``where`` (the
    config file), or for ``override_where`` when the key is one of ``overridden`` (given by
    ``--set``), as :func:`~attnflow.io.config_unused.check_unused` reports."""
    model = config.model
    reasons = {
        "attention": (config.attention is not None, "absent (the landscape of heads is not built)"),
        "model.causal": (model.causal is not False, "false (a causal mask is not a gradient flow)"),
        "model.value": (model.value != "gradient", "'gradient' (logits_only is not a gradient flow)"),
        "model.sources": (model.sources != 0, "0 (held sources change the stationary states)"),
    }
    for key, (refused, constraint) in reasons.items():
        if refused:
            value = "a section" if key == "attention" else getattr(model, key.split(".")[1])
            shown = override_where if key in overridden else where
            raise ConfigError.from_parts(key, f"{constraint} for `attnflow landscape`", value, where=shown)


def _quiet_build(config: Config) -> Simulation:
    with warnings.catch_warnings():  # the dt stability warning: no flow is run at these points
        warnings.simplefilter("ignore")
        return build(config)


# --------------------------------------------------------------------------- starts


def candidates(kernel: Kernel, xi: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Closed-form starts of the kernel: (taken as they are, flowed first), both in the content frame."""
    gauge, d = kernel.gauge, kernel.gauge.d
    exact = {"dirac": np.asarray(theory.orbit_configuration(gauge, np.eye(d)[0]))}
    flowed = {}
    factor = kernel.factor
    if isinstance(factor, factors.ToeplitzCos) and xi.ndim == 1 and d >= 2:
        omega = float(factor.omega)
        to_x = lambda u: np.asarray(gauge.apply_transpose(jnp.asarray(u)))  # noqa: E731
        exact["great_circle"] = to_x(theory.great_circle(xi, omega, d))
        exact["antipodal_pair"] = to_x(theory.antipodal_pair(xi, omega, d))
        for f in ARC_FRACTIONS:
            flowed[f"arc_{f:g}"] = to_x(theory.great_circle_arc(xi, omega, f, d))
        angle = np.where(np.cos(omega * xi) >= 0, 0.0, np.pi) + PAIR_SPREAD * np.sin(omega * xi)
        pair_arcs = np.zeros((xi.size, d))
        pair_arcs[:, 0], pair_arcs[:, 1] = np.cos(angle), np.sin(angle)
        flowed["antipodal_arcs"] = to_x(pair_arcs)
        phase = np.mod(omega * xi + np.pi, 2 * np.pi) - np.pi  # in [−π, π)
        inside = np.abs(phase) < CLUSTER_HALF_WIDTH * np.pi
        angle = np.where(inside, 0.0, np.pi + ARC_COMPRESSION * (np.mod(phase, 2 * np.pi) - np.pi))
        cluster_arc = np.zeros((xi.size, d))
        cluster_arc[:, 0], cluster_arc[:, 1] = np.cos(angle), np.sin(angle)
        flowed["cluster_and_arc"] = to_x(cluster_arc)
    return exact, flowed


def _flow(sim: Simulation, x0: np.ndarray, t_end: float, *, noise: float = 0.0, seed: int = 0) -> np.ndarray:
    """The gradient flow of ``E`` (with ``noise``: the noisy dynamics) from a batch ``x0 (B, n, d)``."""
    field = make_vector_field(sim.kernel, block_size=sim.block_size)
    traj = solve(
        field,
        jnp.asarray(x0),
        integrator=sim.integrator,
        dt=sim.dt,
        t_end=t_end,
        save_every=t_end,
        noise=noise,
        key=jax.random.key(seed),
        workers=1,
        max_steps=sim.max_steps,
    )
    return np.asarray(traj.xs[-1])


def start_states(sim: Simulation, *, starts: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Every start (name -> ``x (n, d)``) before Newton: the candidates, then the random starts."""
    n, d = sim.kernel.n, sim.kernel.gauge.d
    exact, flowed = candidates(sim.kernel, sim.xi)
    t_end = sim.t_end
    random = {f"random_{seed + i}": np.asarray(sphere.sample_uniform(seed + i, n, d)) for i in range(starts)}
    annealed = {k: v for i, (k, v) in enumerate(random.items()) if i % 2 == 1}
    plain = {**flowed, **{k: v for k, v in random.items() if k not in annealed}}
    result = dict(exact)
    if plain:
        result.update(zip(plain, _flow(sim, np.stack(list(plain.values())), t_end), strict=True))
    if annealed:
        noise = ANNEAL_NOISE * float(sim.kernel.profile.scale)
        hot = _flow(sim, np.stack(list(annealed.values())), t_end / 2, noise=noise, seed=seed)
        cooled = _flow(sim, hot, t_end / 2)
        result.update({f"annealed_{k.split('_')[1]}": x for k, x in zip(annealed, cooled, strict=True)})
    return result


# --------------------------------------------------------------------------- states


def _frame_invariant(kernel: Kernel, x: np.ndarray) -> np.ndarray:
    return np.linalg.svd(np.asarray(kernel.gauge.apply(jnp.asarray(x))), compute_uv=False)


def _shape(kernel: Kernel, x: np.ndarray) -> str:
    if kernel.gauge.d != 3:
        return "unclassified"
    return classify_shape(np.asarray(kernel.gauge.apply(jnp.asarray(x))))


def describe(
    kernel: Kernel, x: np.ndarray, *, start: str, block_size: int | None, gradient_norm: float
) -> State:
    spectrum = landscape.hessian_spectrum(kernel, x, block_size=block_size)
    return State(
        x=np.asarray(x),
        energy=float(energy(kernel, jnp.asarray(x), block_size=block_size)),
        morse_index=spectrum.index,
        eigenvalues=spectrum.eigenvalues,
        symmetry_dim=spectrum.symmetry_dim,
        gradient_norm=gradient_norm,
        shape=_shape(kernel, x),
        start=start,
    )


def same_state(kernel: Kernel, a: State, b: State) -> bool:
    """Equal modulo symmetry, by invariants (module doc)."""
    if a.morse_index != b.morse_index:
        return False
    if abs(a.energy - b.energy) > ENERGY_RTOL * max(1.0, abs(a.energy)):
        return False
    return bool(np.all(np.abs(_frame_invariant(kernel, a.x) - _frame_invariant(kernel, b.x)) <= FRAME_TOL))


def find_states(
    sim: Simulation,
    *,
    starts: int,
    seed: int = 0,
    gradient_tol: float = landscape.GRADIENT_TOL,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[State], dict[str, dict]]:
    """Newton from every start; the distinct converged states (highest energy first) and, per start,
    where it went (``state`` index or ``None``) and its final gradient norm. ``progress(done,
    total)``: starts solved, from 0 before the first."""
    kernel, block = sim.kernel, sim.block_size
    found: list[State] = []
    log: dict[str, dict] = {}
    begins = start_states(sim, starts=starts, seed=seed)
    for k, (name, x0) in enumerate(begins.items()):
        if progress is not None:
            progress(k, len(begins))
        result = landscape.newton(kernel, x0, gradient_tol=gradient_tol, block_size=block)
        log[name] = {
            "converged": result.converged,
            "gradient_norm": result.gradient_norm,
            "newton": result.iterations,
        }
        if not result.converged:
            continue
        state = describe(kernel, result.x, start=name, block_size=block, gradient_norm=result.gradient_norm)
        for i, other in enumerate(found):
            if same_state(kernel, state, other):
                better = state.gradient_norm < other.gradient_norm
                keep = dataclasses.replace(state if better else other, start=other.start, hits=other.hits + 1)
                found[i] = keep
                break
        else:
            found.append(state)
    if progress is not None:
        progress(len(begins), len(begins))
    order = sorted(range(len(found)), key=lambda i: -found[i].energy)
    found = [found[i] for i in order]
    for entry in log.values():
        entry["state"] = None
    for i, state in enumerate(found):
        for name in log:
            if name == state.start:
                log[name]["state"] = i
    return found, log


# --------------------------------------------------------------------------- continuation


def _eigenvalue(kernel: Kernel, x: np.ndarray, m: int, block: int | None) -> tuple[float, np.ndarray]:
    """The m-th largest Hessian eigenvalue (1-based, modulo rotations) at the state Newton reaches from x."""
    result = landscape.newton(kernel, x, block_size=block)
    values = landscape.hessian_spectrum(
        kernel, result.x, block_size=block, k=max(m, N_EIGENVALUES)
    ).eigenvalues
    return float(values[m - 1]), result.x


def _branch_end(
    config: Config, key: str, x: np.ndarray, good: float, bad: float, gradient_tol: float
) -> float:
    """The last parameter between ``good`` (Newton converged there, to ``x``) and ``bad`` (it did
    not) at which Newton from the last converged state still converges: bisection, END_HALVINGS."""
    for _ in range(END_HALVINGS):
        mid = 0.5 * (good + bad)
        sim = _quiet_build(with_value(config, key, mid))
        result = landscape.newton(
            sim.kernel, x, gradient_tol=gradient_tol, block_size=sim.block_size, max_iter=CONTINUATION_NEWTON
        )
        if result.converged:
            good, x = mid, result.x
        else:
            bad = mid
    return good


def follow(
    config: Config, state: State, continuation: Continuation, *, gradient_tol: float = landscape.GRADIENT_TOL
) -> tuple[list[dict], list[dict]]:
    """Natural continuation of ``state`` over ``continuation.values`` from the value nearest the
    config's own, upwards and downwards, Newton from the previous point's state. A direction stops
    where Newton does not converge (a fold: the branch ends), located by bisection
    (:func:`_branch_end`). Returns the branch rows and its transitions: ``kind`` "index" (an
    eigenvalue crosses 0: ``index_below`` → ``index_above``, located by a root search on that
    eigenvalue) or "end" (the branch exists on one side only; the other side's index is empty)."""
    key, values = continuation.key, continuation.values
    section, name = key.split(".")
    base = float(getattr(getattr(config, section), name))
    i0 = int(np.argmin(np.abs(values - base)))
    points: dict[int, tuple[State, Kernel]] = {}
    ends = []
    for direction in (range(i0, len(values)), range(i0, -1, -1)):
        x, previous = state.x, None
        for i in direction:
            sim = _quiet_build(with_value(config, key, float(values[i])))
            result = landscape.newton(
                sim.kernel,
                x,
                gradient_tol=gradient_tol,
                block_size=sim.block_size,
                max_iter=CONTINUATION_NEWTON,
            )
            if not result.converged:
                if previous is not None:
                    at = _branch_end(config, key, x, float(values[previous]), float(values[i]), gradient_tol)
                    index = points[previous][0].morse_index
                    below, above = (index, math.nan) if i > previous else (math.nan, index)
                    ends.append(
                        {
                            key: at,
                            "kind": "end",
                            "index_below": below,
                            "index_above": above,
                            "eigenvalue": math.nan,
                        }
                    )
                break
            x, previous = result.x, i
            if i not in points:
                points[i] = (
                    describe(
                        sim.kernel,
                        x,
                        start=state.start,
                        block_size=sim.block_size,
                        gradient_norm=result.gradient_norm,
                    ),
                    sim.kernel,
                )
    indices = sorted(points)
    rows = [
        {
            key: float(values[i]),
            "energy": points[i][0].energy,
            "morse_index": points[i][0].morse_index,
            "lambda_1": float(points[i][0].eigenvalues[0]),
            "gradient_norm": points[i][0].gradient_norm,
            "shape": points[i][0].shape,
        }
        for i in indices
    ]
    transitions = []
    for a, b in zip(indices, indices[1:], strict=False):
        (sa, _), (sb, _) = points[a], points[b]
        if b != a + 1 or sa.morse_index == sb.morse_index:
            continue
        m = min(sa.morse_index, sb.morse_index) + 1

        def crossing(p, x=sa.x, m=m):
            sim = _quiet_build(with_value(config, key, float(p)))
            return _eigenvalue(sim.kernel, x, m, sim.block_size)[0]

        fa, fb = crossing(values[a]), crossing(values[b])
        if fa * fb < 0:
            at = scipy.optimize.brentq(crossing, float(values[a]), float(values[b]), xtol=1e-7)
        else:  # the eigenvalue sits on the threshold at one end: interpolate
            at = float(values[a] + (values[b] - values[a]) * fa / (fa - fb)) if fa != fb else float(values[a])
        transitions.append(
            {
                key: float(at),
                "kind": "index",
                "index_below": sa.morse_index,
                "index_above": sb.morse_index,
                "eigenvalue": m,
            }
        )
    return rows, sorted(transitions + ends, key=lambda row: row[key])


# --------------------------------------------------------------------------- the folder


def _csv(rows: list[dict]) -> str:
    if not rows:
        return ""
    columns = list(rows[0])
    lines = [",".join(columns)]
    for row in rows:
        lines.append(",".join(_cell(row[c]) for c in columns))
    return "\n".join(lines) + "\n"


def _cell(value) -> str:
    if isinstance(value, float):
        return "" if not math.isfinite(value) else repr(value)
    return str(value)


def state_rows(states: list[State]) -> list[dict]:
    rows = []
    for i, s in enumerate(states):
        top = np.full(N_EIGENVALUES, np.nan)
        top[: min(N_EIGENVALUES, s.eigenvalues.size)] = s.eigenvalues[:N_EIGENVALUES]
        row = {
            "state": i,
            "energy": s.energy,
            "morse_index": s.morse_index,
            "shape": s.shape,
            "gradient_norm": s.gradient_norm,
            "symmetry_dim": s.symmetry_dim,
            "start": s.start,
            "hits": s.hits,
        }
        row.update({f"lambda_{k + 1}": float(v) for k, v in enumerate(top)})
        rows.append(row)
    return rows


@dataclasses.dataclass(frozen=True)
class LandscapeResult:
    states: list[State]
    starts: dict[str, dict]
    branches: list[dict]
    transitions: list[dict]
    files: list[Path]


def run_landscape(
    config: Config,
    out: str | Path,
    *,
    starts: int = 8,
    seed: int = 0,
    continuation: Continuation | None = None,
    gradient_tol: float = landscape.GRADIENT_TOL,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> LandscapeResult:
    """Find the stationary states of ``config``'s kernel, optionally continue them, write ``out``
    (new or empty, or with ``overwrite`` an earlier landscape folder: :mod:`attnflow.io.run_folder`).
    ``progress(done, total)``: the starts solved (:func:`find_states`)."""
    check_gradient_flow(config)
    run_folder.check_claim(out, run_folder.LANDSCAPE, overwrite=overwrite)  # before the Newton solves
    if starts < 0:
        raise ValueError(f"landscape: `starts` must be >= 0; got {starts!r}.")
    if continuation is not None:  # a bad key or value fails here, before any solve
        if continuation.key in SHAPE_KEYS:
            shape = " or ".join(SHAPE_KEYS)
            raise ValueError(
                f"{CONTINUE}: `KEY` must be a key that keeps the states' shape (not {shape}: a branch "
                f"is followed at fixed n and d); got {continuation.key!r}."
            )
        # the ends (a bound on the value) and one step in (a step that is not an integer)
        values = continuation.values
        for value in dict.fromkeys(float(v) for v in (values[0], values[1 % values.size], values[-1])):
            with_value(config, continuation.key, value)
        if continuation.key.count(".") != 1:
            raise ValueError(f"{CONTINUE}: `KEY` must be a config key section.key; got {continuation.key!r}.")
    sim = build(config)
    states, log = find_states(sim, starts=starts, seed=seed, gradient_tol=gradient_tol, progress=progress)
    branches, transitions = [], []
    if continuation is not None:
        for i, state in enumerate(states):
            rows, changes = follow(config, state, continuation, gradient_tol=gradient_tol)
            branches += [{"branch": i, **row} for row in rows]
            transitions += [{"branch": i, **change} for change in changes]
    out = Path(out)
    with run_folder.claimed(out, run_folder.LANDSCAPE, overwrite=overwrite):
        files = [write_text(out / "states.csv", _csv(state_rows(states)))]
        npz = out / "states.npz"
        with replacing(npz) as tmp, open(tmp, "wb") as handle:  # whole or not at all
            np.savez(
                handle,
                x=np.stack([s.x for s in states])
                if states
                else np.zeros((0, sim.kernel.n, sim.kernel.gauge.d)),
                energy=np.array([s.energy for s in states]),
                morse_index=np.array([s.morse_index for s in states], dtype=int),
                xi=np.asarray(sim.xi),
            )
        files.append(npz)
        if continuation is not None:
            files.append(write_text(out / "branches.csv", _csv(branches)))
            files.append(write_text(out / "transitions.csv", _csv(transitions)))
            files.append(write_branch_figure(branches, continuation.key, out / "branches.png"))
        summary = {
            "config": resolved_dict(config),
            "starts": log,
            "states": len(states),
            "continuation": None
            if continuation is None
            else {"key": continuation.key, "values": continuation.values},
            "transitions": transitions,
        }
        files.append(write_json(out / "landscape.json", summary))
    return LandscapeResult(states=states, starts=log, branches=branches, transitions=transitions, files=files)


__all__ = [
    "Continuation",
    "LandscapeResult",
    "State",
    "candidates",
    "find_states",
    "follow",
    "parse_continuation",
    "run_landscape",
    "same_state",
    "start_states",
    "with_value",
]
