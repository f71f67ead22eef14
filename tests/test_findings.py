"""What the audit found, each as a property the old code got wrong.

D3 (``w = cos 2π(ξ−ζ)``, ``ξ_i = i/n``, exp profile, n = 64): one arc of a great circle is a strict
local maximum modulo rotations with the highest energy found for β in [1.75, 4]; the antipodal arcs
and the great circle are lower (the crossing β* of the circle and antipodal-pair energies is not a
change of maximiser). ``Certificate`` separates a local statement from a proven global one. A causal
run refuses positions that are not in token order.

Reference energies are independent measurements (Newton to ``|P_x∇E| ~ 1e-15`` and the dense
Hessian of ``attnflow.analysis.theory``); the arcs of the seeds come from the gradient flow.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.analysis import landscape, theory
from attnflow.analysis.shapes import classify_shape
from attnflow.core import factors, gauges, sphere
from attnflow.core.kernel import Kernel, make_profile
from attnflow.io.config import ConfigError, config_from_dict
from attnflow.numerics.dynamics import make_vector_field
from attnflow.numerics.integrators import make_integrator
from attnflow.numerics.solve import solve
from attnflow.workflows.build import build

N = 64
ENERGY_TOL = 5e-6  # the references are printed to 6 digits (Newton converges to round-off)


def d3_kernel(beta, n=N, profile="exp"):
    xi = jnp.arange(n) / n
    factor = factors.ToeplitzCos(xi=xi, omega=jnp.asarray(2 * np.pi))
    return Kernel(gauges.IdentityGauge(n=n, d=3), factor, make_profile(profile, beta=beta)), np.asarray(xi)


def strict_local_max(kernel, x):
    """Gradient, and the top eigenvalue of the dense Hessian after the 3 rotation zero modes."""
    cert = theory.certify(kernel, x)
    eig = cert.hessian_eigenvalues[::-1]
    zero = np.abs(eig) <= 1e-12  # the rotation modes: round-off of a (nd)² Hessian
    return cert, int(zero.sum()), float(eig[~zero][0])


@pytest.mark.parametrize(
    ("beta", "arc", "circle", "circle_index"),
    [(2.5, 0.548644, 0.503343, 9), (3.0, 0.758807, 0.658895, 9)],
)
def test_d3_one_arc_is_a_strict_local_maximum_above_the_great_circle(beta, arc, circle, circle_index):
    kernel, xi = d3_kernel(beta)
    found = landscape.newton(kernel, theory.great_circle_arc(xi, 2 * np.pi, 0.6))
    assert found.converged and found.gradient_norm <= 1e-13
    assert found.energy == pytest.approx(arc, abs=ENERGY_TOL)
    assert classify_shape(found.x) == "arc"
    cert, n_zero, top = strict_local_max(kernel, found.x)
    assert n_zero == 3 and top < -1e-3  # every non-symmetry eigenvalue negative, by a margin
    assert cert.is_local_maximiser() and not cert.is_global_maximiser()  # no bound is known in D3
    assert landscape.hessian_spectrum(kernel, found.x).index == 0
    circle_state = landscape.newton(kernel, theory.great_circle(xi, 2 * np.pi))
    assert circle_state.energy == pytest.approx(circle, abs=ENERGY_TOL)
    assert landscape.hessian_spectrum(kernel, circle_state.x).index == circle_index
    assert not theory.certify(kernel, circle_state.x).is_local_maximiser()
    assert circle < found.energy


@pytest.mark.slow
def test_d3_flow_ends_below_the_clean_arc():
    # β = 3, τ = 400 from uniform data: seed 1 ends on an arc with a token pair on the wrong side of
    # the gap (0.754939), seed 2 on converged antipodal arcs (0.748020); both strict local maxima,
    # both below the clean arc (0.758807) and above the great circle (0.658895).
    kernel, xi = d3_kernel(3.0)
    x0 = jnp.stack([sphere.sample_uniform(seed, N, 3) for seed in (1, 2)])
    traj = solve(
        make_vector_field(kernel),
        x0,
        integrator=make_integrator("rk4"),
        dt=0.01,
        t_end=400.0,
        save_every=400.0,
        workers=1,
    )
    for x_end, energy, shape in zip(
        traj.xs[-1], (0.754939, 0.748020), ("arc", "antipodal_arcs"), strict=True
    ):
        found = landscape.newton(kernel, x_end)
        assert found.converged and found.energy == pytest.approx(energy, abs=ENERGY_TOL)
        assert classify_shape(found.x) == shape
        _, n_zero, top = strict_local_max(kernel, found.x)
        assert n_zero == 3 and top < 0
        assert 0.658895 < found.energy < 0.758807


def test_local_maximiser_is_not_global():
    # β = 2: the clean arc (0.411211) and the arc with token 1 on the far side of the gap (0.409138)
    # are both second-order critical points; only a bound could make either global, and D3 has none.
    kernel, xi = d3_kernel(2.0)
    clean = landscape.newton(kernel, theory.great_circle_arc(xi, 2 * np.pi, 0.6))
    moved = xi.copy()
    moved[1] = 1.0 + 0.5 / N  # token 1 placed past the last token
    defect = landscape.newton(kernel, theory.great_circle_arc(moved, 2 * np.pi, 0.6))
    assert clean.energy == pytest.approx(0.411211, abs=ENERGY_TOL)
    assert defect.energy == pytest.approx(0.409138, abs=ENERGY_TOL)
    for state in (clean, defect):
        cert = theory.certify(kernel, state.x)
        assert cert.is_local_maximiser() and not cert.is_global_maximiser()
    # D2 (linear profile): the great circle attains the spectral bound, a proven global maximum.
    linear, xi = d3_kernel(1.0, n=16, profile="linear")
    cert = theory.certify(linear, theory.great_circle(xi, 2 * np.pi))
    assert cert.is_local_maximiser() and cert.is_global_maximiser()
    # ... and a lower stationary state of it (the antipodal pair) is neither
    pair = theory.certify(linear, theory.antipodal_pair(xi, 2 * np.pi))
    assert pair.gradient_norm < 1e-14 and not pair.is_global_maximiser() and not pair.is_local_maximiser()


def _causal_config(tmp_path, positions, causal=True):
    path = tmp_path / "xi.npy"
    np.save(path, np.asarray(positions, dtype=np.float64))
    return config_from_dict(
        {
            "model": {"n": len(positions), "causal": causal},
            "aux": {"kind": "file", "path": str(path)},
            "gauge": {"kind": "rope"},
        }
    )


def test_causal_run_refuses_positions_out_of_token_order(tmp_path):
    message = (
        r"^config: `aux.path` must be non-decreasing in token order with model.causal or model.sources "
        r"\(masks and held sources follow the token order\); got 'xi\[1\] = 2 > xi\[2\] = 1'\. "
        r"Sort the tokens by position"
    )
    with pytest.raises(ConfigError, match=message):
        build(_causal_config(tmp_path, [0.0, 2.0, 1.0, 3.0]))
    build(_causal_config(tmp_path, [0.0, 1.0, 1.0, 3.0]))  # ties are in order
    build(_causal_config(tmp_path, [0.0, 2.0, 1.0, 3.0], causal=False))  # no mask, no order needed
