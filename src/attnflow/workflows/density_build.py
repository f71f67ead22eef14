"""From a validated ``Config`` with a ``[density]`` section to the density run's runtime objects.

``build_density(config)`` is the density's only reader of a config (as
:func:`attnflow.workflows.build.build` is the particles'): the label quadrature, the gauge and the
factor on its nodes, the profile, the field on S^1 (``density.grid``) or S^2 (``density.lmax``), the
initial law, the step, and what a snapshot stores. Everything is checked here, before a run folder
is touched, and refused as a :class:`ConfigError` naming the key:

- the grid must hold the kernel (its Fourier coefficients past ``grid/3``, or its Funk–Hecke
  eigenvalues past ``2 lmax/3``, below ``1e-12`` of the first: ``density_circle.kernel_grid``,
  ``density_sphere.kernel_lmax``), where the resolution status measures the tail;
- the run must fit in memory (an estimate from the grid and the labels, before anything is made);
- ``solver.dt`` must be at most the law-independent stable step (``safe_dt``);
- the label file ``aux.path``: ``(L,)`` nodes (equal weights) or ``(L, 2)`` nodes and positive
  weights (rescaled to sum 1); a factor file ``(L, L)``; a gauge file ``(L, d, d)`` of orthogonal
  matrices;
- the initial law: finite, non-negative, of positive mass in every row (each row is rescaled to
  mass 1), of shape ``(L, grid)`` or ``(grid,)``, and resolved on the grid at ``t = 0``.

Positions are the uniform law on ``[0, 1)`` (``density.labels`` nodes of ``density.label_rule``): a
RoPE frequency ``ω`` turns label ``ξ`` by ``ω ξ`` (``"full_period"``: ``ω = 2π``, a full turn over the
positions, as ``2π/n`` over the indices of ``n`` particles), the Toeplitz cosine is
``cos(ω (ξ − ζ))`` and the distance bias ``exp(−slope |ξ − ζ|)``. Prompt ids ``0..K−1`` have equal
masses ``1/K`` (the law of a cyclic or random assignment as ``n → ∞``).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from attnflow.core import factors, gauges
from attnflow.core.host import to_device
from attnflow.core.kernel import Profile, make_profile
from attnflow.io.config import Config, ConfigError
from attnflow.io.density_store import DensityArray
from attnflow.io.parameters import library_errors
from attnflow.numerics import density_circle as dc
from attnflow.numerics import density_rotation
from attnflow.numerics import density_sphere as ds
from attnflow.numerics.integrators import RK4, Adaptive, Euler, Integrator
from attnflow.numerics.saving import snapshot_count, whole_multiple
from attnflow.numerics.status import Status
from attnflow.workflows.density_initial import circle_initial, load_checked, sphere_initial

__all__ = ["DensityRun", "build_density", "memory_estimate"]

# bytes held at once, in copies of one state-sized array (RK4's stages and their FFT or harmonic
# transforms, the velocity and flux components, a snapshot's copies on the host): a bound, not a count
_CIRCLE_COPIES = 40
_SPHERE_GRID_COPIES = 40  # per label: grid values of f, 3 velocity, 3 flux, 3 cross components, ...
_SPHERE_COEFF_COPIES = 24  # per label: the harmonic coefficients of the stages and the ladders
MEMORY_SHARE = 0.5  # a density run may take at most this share of the machine's memory
DENSITY_METHODS = {"euler": Euler, "rk4": RK4, "adaptive": Adaptive}


@dataclasses.dataclass(frozen=True)
class DensityRun:
    """Everything a density run needs, built from a config (no config inside).

    ``field``/``state0``: the density field and the initial state (:mod:`density_circle` or
    :mod:`density_sphere`); ``domain``: ``"circle"`` or ``"sphere"``; ``arrays`` and ``coords``:
    what the store keeps of a snapshot. On S^2 with a gauge, ``frames (L, 3, 3)``: each label's
    ``Q(ξ_l)`` (the solver's slices are in the gauge frame ``u = Q x``), and ``wigner``: its Wigner
    matrices (:func:`attnflow.numerics.density_rotation.wigner_blocks`), which turn the slices back
    to the content frame of the stored ``f``; both None without a gauge or on S^1."""

    domain: str
    field: object
    state0: object
    labels: dc.LabelQuadrature
    integrator: Integrator  # Adaptive: error-controlled steps from a first trial step ``dt``
    dt: float
    steps_per_snapshot: int  # fixed steps per snapshot (0 for adaptive steps)
    snapshots: int  # snapshots in all, the initial one included
    save_every: float
    safe_dt: float
    beta: float
    arrays: dict[str, DensityArray]
    coords: dict[str, tuple]
    frames: np.ndarray | None = None
    wigner: jax.Array | None = None
    max_steps: int | None = None  # adaptive: trial steps of the whole run (``solver.max_steps``)


def _fail(key: str, constraint: str, value, hint: str = "") -> ConfigError:
    return ConfigError.from_parts(key, constraint, value, hint=hint)


# --- labels, gauge, factor --------------------------------------------------------------------------


def density_labels(config: Config) -> dc.LabelQuadrature:
    """The label quadrature: one node (no labels), ``density.labels`` positions on ``[0, 1)``, the
    prompt ids with equal masses, or the nodes (and weights) of ``aux.path``."""
    aux, density = config.aux, config.density
    if aux.kind == "none":
        return dc.make_labels([0.0], [1.0])
    if aux.kind == "positions":
        return dc.position_labels(density.labels, rule=density.label_rule)
    if aux.kind == "prompts":
        return dc.prompt_labels(np.full(aux.n_prompts, 1.0 / aux.n_prompts))
    table = load_checked("aux.path", aux.path)
    if table.ndim == 1 and table.size >= 1:
        return dc.make_labels(table, np.full(table.size, 1.0 / table.size))
    if table.ndim == 2 and table.shape[0] >= 1 and table.shape[1] == 2:
        weights = table[:, 1]
        if np.any(weights <= 0):
            raise _fail(
                "aux.path", "a file of positive weights (its second column)", f"min {weights.min():g}"
            )
        return dc.make_labels(table[:, 0], weights / weights.sum())
    raise _fail(
        "aux.path",
        "an array of shape (L,) (label nodes, equal weights) or (L, 2) (nodes, weights) for a density",
        f"{aux.path} with shape {table.shape}",
    )


def _rope_omega(config: Config) -> float:
    """The RoPE frequency on positions in ``[0, 1)`` (``"full_period"``: ``2π``)."""
    g = config.gauge
    freqs = gauges.rope_frequencies(config.model.d, kind=g.frequencies, n=1, base=g.base)
    return float(np.sum(freqs[:1]))


def _gauge_matrices(config: Config, labels: dc.LabelQuadrature, d: int) -> np.ndarray | None:
    """The config's gauge on the label nodes as orthogonal ``(L, d, d)`` matrices (the particles'
    builders; positions on ``[0, 1)``: ``"full_period"`` is ``ω = 2π``); None without a gauge."""
    g, nodes, count = config.gauge, np.asarray(labels.nodes), labels.size
    if g.kind == "none":
        return None
    if g.kind == "rope":
        return np.asarray(gauges.make_rope(nodes, d, [_rope_omega(config)]).matrices())
    if g.kind == "generalized_rope":
        generators = g.generators if g.generators is not None else [gauges.axis_generator(a) for a in g.axes]
        omega = 2.0 * math.pi if g.omega == "full_period" else float(g.omega)
        return np.asarray(gauges.make_generalized_rope(nodes, generators, g.rates, omega=omega).matrices())
    if g.kind == "prompt":
        return gauges.haar_orthogonal(g.seed, config.aux.n_prompts, d)[nodes.astype(int)]
    q = load_checked("gauge.path", g.path)
    if q.shape != (count, d, d):
        raise _fail(
            "gauge.path", f"an array of shape ({count}, {d}, {d}) (one per label node)", f"shape {q.shape}"
        )
    try:
        return gauges.check_orthogonal(q, name="gauge.path")
    except ValueError as error:
        raise _fail("gauge.path", "orthogonal matrices", str(error)) from None


def _circle_gauge(config: Config, labels: dc.LabelQuadrature) -> dc.CircleGauge:
    if config.gauge.kind == "none":
        return dc.identity_circle_gauge(labels.size)
    if config.gauge.kind == "rope":
        return dc.rope_circle_gauge(labels, _rope_omega(config))
    return dc.circle_gauge_from_matrices(_gauge_matrices(config, labels, 2))


def _factor(config: Config, labels: dc.LabelQuadrature) -> factors.Factor:
    f, count = config.factor, labels.size
    xi = labels.nodes
    if f.kind == "none":
        return factors.NoFactor(n=count)
    if f.kind == "distance_bias":
        return factors.DistanceBias(xi=xi, slope=to_device(f.slope, jnp.float64))
    if f.kind == "toeplitz_cos":
        return factors.ToeplitzCos(xi=xi, omega=to_device(f.omega, jnp.float64))
    w = load_checked("factor.path", f.path)
    if w.shape != (count, count):
        raise _fail("factor.path", f"an array of shape ({count}, {count}) (label nodes)", f"shape {w.shape}")
    try:
        return factors.make_matrix_factor(w, n=count)
    except ValueError as error:
        raise _fail("factor.path", "a symmetric matrix", str(error)) from None


# --- memory -------------------------------------------------------------------------------------------


def _label_count(config: Config) -> int:
    aux = config.aux
    if aux.kind == "positions":
        return config.density.labels
    if aux.kind == "prompts":
        return aux.n_prompts
    if aux.kind == "file":
        return 0  # known once the file is read (checked again then)
    return 1


def memory_estimate(config: Config, profile: Profile, labels: int) -> dict[str, int]:
    """An upper estimate of the bytes a density run holds at once, by the key that drives each term."""
    density = config.density
    terms = {"factor": 4 * labels * labels * 8}
    if density.grid is not None:
        terms["density.grid"] = _CIRCLE_COPIES * labels * density.grid * 8
        return terms
    size = density.lmax + 1
    kept, nlat, nlon = ds.grid_shape(profile, density.lmax)
    wigner = labels * size * size * (2 * size - 1) * 16 if config.gauge.kind != "none" else 0
    terms["density.lmax"] = (
        3 * size * size * nlat * 8  # the Legendre table and its even/odd halves
        + _SPHERE_GRID_COPIES * labels * nlat * nlon * 8
        + _SPHERE_COEFF_COPIES * labels * size * size * 16
        + 2 * wigner  # a gauge's Wigner matrices, on the host and in the program
    )
    return terms


def check_memory(config: Config, profile: Profile, labels: int, *, limit: int | None = None) -> None:
    """Refuse, naming ``density.grid`` or ``density.lmax``, a run beyond ``MEMORY_SHARE`` of memory."""
    from attnflow.workflows.build import physical_memory

    limit = int(MEMORY_SHARE * physical_memory()) if limit is None else limit
    terms = memory_estimate(config, profile, labels)
    total = sum(terms.values())
    if total <= limit:
        return
    key = "density.grid" if config.density.grid is not None else "density.lmax"
    raise _fail(
        key,
        f"small enough for memory: about {total / 2**30:.3g} GiB needed with {labels} label nodes, "
        f"{limit / 2**30:.3g} GiB available",
        getattr(config.density, key.split(".")[1]),
    )


@jax.jit
def _resolution(field, state) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(status code, tail, negative mass)`` of a state (one compiled program)."""
    module = dc if isinstance(field, dc.CircleDensityField) else ds
    tail, negative = module.resolution(field, state)
    return module.status_code(field, state), tail, negative


# --- the run ------------------------------------------------------------------------------------------


def _checked_field(config: Config, profile: Profile, labels, factor):
    """The field, the kernel's bandwidth checked against the grid first (one line naming the key)."""
    density, model = config.density, config.model
    if density.grid is not None:
        if profile.kind == "exp" and density.grid < dc.kernel_grid(model.beta):
            raise _fail(
                "density.grid",
                f"at least {dc.kernel_grid(model.beta)} to resolve the kernel at beta = {model.beta:g} "
                f"(its Fourier coefficients past grid/3 below {dc.KERNEL_TAIL:g} of the first)",
                density.grid,
                hint="Raise density.grid or lower model.beta.",
            )
        gauge = _circle_gauge(config, labels)
        with library_errors():  # a softmax over a sign-changing factor (core.factors), under its key
            return dc.make_circle_field(
                profile,
                grid=density.grid,
                labels=labels,
                gauge=gauge,
                factor=factor,
                normalization=model.normalization,
            )
    needed = ds.kernel_lmax(profile)
    if density.lmax < needed:
        raise _fail(
            "density.lmax",
            f"at least {needed} to resolve the kernel at beta = {model.beta:g} (its Funk-Hecke "
            f"eigenvalues past 2 lmax/3 below {dc.KERNEL_TAIL:g} of the first)",
            density.lmax,
            hint="Raise density.lmax or lower model.beta.",
        )
    with library_errors():
        return ds.make_sphere_field(
            profile, lmax=density.lmax, labels=labels, factor=factor, normalization=model.normalization
        )


def build_density(config: Config) -> DensityRun:
    """The density run of ``config`` (which has a ``[density]`` section), every input checked."""
    if config.density is None:
        raise ConfigError("density: `density` must be a section of the config; got none.")
    density, model, solver = config.density, config.model, config.solver
    profile = make_profile(model.profile, beta=model.beta, time_scale=model.time_scale)
    check_memory(config, profile, _label_count(config))
    labels = density_labels(config)
    check_memory(config, profile, labels.size)
    factor = _factor(config, labels)
    field = _checked_field(config, profile, labels, factor)
    frames = wigner = None
    if density.grid is not None:
        domain = "circle"
        state0 = circle_initial(config, labels, density.grid)
        safe = dc.safe_dt(field)
    else:
        domain = "sphere"
        frames = _gauge_matrices(config, labels, 3)
        if frames is not None:  # on the device once: each snapshot's content-frame law reads them
            wigner = jnp.asarray(density_rotation.wigner_blocks(frames, density.lmax))
        state0 = sphere_initial(config, field, labels, frames)
        safe = ds.safe_dt(field)
    if solver.dt > safe:
        raise _fail(
            "solver.dt",
            f"at most {safe:.4g}, the step stable for every law on this grid (safe_dt: explicit Runge-Kutta "
            "on the grid's fastest mode)",
            solver.dt,
            hint="Lower solver.dt (keeping solver.save_every a whole multiple of it).",
        )
    code, tail, negative = _resolution(field, state0)
    if int(code) != Status.ok.code:
        key = (
            "density.path"
            if density.init == "file"
            else ("density.kappa" if density.init == "vmf" else "density.amplitude")
        )
        domain_key = "density.grid" if domain == "circle" else "density.lmax"
        raise _fail(
            key,
            f"an initial law resolved on the grid (spectral share in the top third <= {dc.TAIL_TOL:g}, "
            f"negative mass <= {dc.NEGATIVE_TOL:g})",
            f"share {float(tail):.3g}, negative mass {float(negative):.3g}",
            hint=f"Raise {domain_key}, or smooth the initial law.",
        )
    if solver.method == "adaptive":
        steps, integrator = 0, Adaptive(retraction="none", rtol=solver.rtol, atol=solver.atol)
    else:
        steps = whole_multiple("save_every", solver.save_every, "dt", solver.dt)
        integrator = DENSITY_METHODS[solver.method](retraction="none")
    return DensityRun(
        domain=domain,
        field=field,
        state0=state0,
        labels=labels,
        integrator=integrator,
        dt=float(solver.dt),
        steps_per_snapshot=steps,
        snapshots=snapshot_count(solver.t_end, solver.save_every),
        save_every=float(solver.save_every),
        safe_dt=float(safe),
        beta=float(model.beta),
        arrays=_arrays(domain, field, labels),
        coords=_coords(domain, field, labels),
        frames=frames,
        wigner=wigner,
        max_steps=solver.max_steps,
    )


_F_ATTRS = {"units": "1"}


def _arrays(domain: str, field, labels) -> dict[str, DensityArray]:
    count = labels.size
    if domain == "circle":
        attrs = {
            **_F_ATTRS,
            "long_name": "density f(t, label, theta) of each label's law w.r.t. d theta (mass 1)",
        }
        return {"f": DensityArray(("label", "theta"), (count, field.grid), attrs)}
    nlat, size = field.mu.shape[0], field.lmax + 1
    attrs = {
        **_F_ATTRS,
        "long_name": "density f(t, label, lat, lon) of each label's law w.r.t. area (mass 1)",
    }
    coeff = {
        "long_name": "harmonic coefficients a_lm (m >= 0; real, imaginary) of the gauge-frame slices",
        "units": "1",
    }
    return {
        "f": DensityArray(("label", "lat", "lon"), (count, nlat, field.nlon), attrs),
        "a": DensityArray(("label", "degree", "order", "part"), (count, size, size, 2), coeff),
    }


def _coords(domain: str, field, labels) -> dict[str, tuple]:
    coords = {
        "label": (("label",), np.asarray(labels.nodes), {"long_name": "label node xi_l", "units": "1"}),
        "weight": (
            ("label",),
            np.asarray(labels.weights),
            {"long_name": "quadrature weight rho_l", "units": "1"},
        ),
    }
    if domain == "circle":
        angles = dc.grid_angles(field.grid)
        coords["theta"] = (("theta",), angles, {"long_name": "angle theta_k = 2 pi k / M", "units": "rad"})
        return coords
    lat = np.degrees(np.arcsin(np.asarray(field.mu)))
    lon = 360.0 * np.arange(field.nlon) / field.nlon
    coords["lat"] = (
        ("lat",),
        lat,
        {"long_name": "latitude (Gauss-Legendre nodes)", "units": "degrees_north"},
    )
    coords["lon"] = (("lon",), lon, {"long_name": "longitude", "units": "degrees_east"})
    return coords


# --- what a snapshot stores, and its state back ----------------------------------------------------------


@jax.jit
def content_values(field, a, wigner):
    """Grid values ``(L, nlat, nlon)`` of the content-frame slices (S^2) from the gauge-frame
    coefficients ``a`` (``wigner``: the run's Wigner matrices; None: no gauge)."""
    return field.synthesis(a if wigner is None else density_rotation.rotate_coefficients(a, wigner))


def snapshot_arrays(run: DensityRun, state) -> dict[str, np.ndarray]:
    """The arrays the store keeps of ``state`` (NumPy, float64)."""
    if run.domain == "circle":
        return {"f": np.asarray(state.f)}
    f = content_values(run.field, state.a, run.wigner)
    a = np.asarray(state.a)
    return {"f": np.asarray(f), "a": np.stack([a.real, a.imag], axis=-1)}


def state_from_arrays(run: DensityRun, arrays: dict[str, np.ndarray]):
    """The state of a stored snapshot (bitwise the state that was stored)."""
    if run.domain == "circle":
        return dc.CircleDensity(f=jnp.asarray(arrays["f"]))
    a = np.empty(arrays["a"].shape[:-1], np.complex128)
    a.real, a.imag = arrays["a"][..., 0], arrays["a"][..., 1]  # bitwise the parts (no 1j * product)
    return ds.SphereDensity(a=jnp.asarray(a))
