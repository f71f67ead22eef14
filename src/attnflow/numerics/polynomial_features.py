"""A polynomial of the logit, ``p_L(s) ≈ e^{β(s−1)}``, and its monomial features: the low-rank
factorisation behind ``attnflow.numerics.expansion``.

The kernel ``φ'(s)/φ'(1) = e^{β(s−1)}`` is replaced by the Chebyshev truncation of degree ``L`` on
``|s| <= a`` (``a = SHELL``)::

    e^{β(s−1)} = e^{−β} [I_0(βa) + 2 Σ_{k≥1} I_k(βa) T_k(s/a)],

written in the monomial basis ``p_L(s) = Σ_{k≤L} c_k s^k`` (the economised polynomial). Its
error is at most the coefficient tail ``2 e^{−β} Σ_{k>L} I_k(βa)``, bounded in closed form by
``tail_bound`` (from ``I_k(z) <= (z/2)^k / k! · e^{z²/(4(k+1))}``). Then, with the multinomial
expansion ``⟨u, v⟩^k = Σ_{|α|=k} (k choose α) u^α v^α``,

    p_L(⟨u, v⟩) = Σ_{|α|<=L} weight_α u^α v^α,     weight_α = c_{|α|} (|α| choose α),

a product of features of rank ``R = C(L + d, d)`` (``monomial_exponents``). The engine uses them
split (``split_features``): ``u^α = T_β(u) u_1^a`` with ``α = (a, β)``, ``T`` the ``G = C(L + d − 1,
d − 1)`` monomials of the other coordinates and ``a = 0 … L``, so that a sum over tokens of
features times values is one wide matrix product; the ``G (L + 1) − R`` pairs with ``a + |β| > L``
get weight 0 (``split_weights``).

Why monomials of the raw logit and not spherical harmonics (rank ``(L+1)²`` in d = 3, ``2L+1`` in
d = 2): the step-then-renormalise integrators evaluate the field at stage points off the sphere
(``|x_i| ≠ 1``), where ``e^{β⟨u,v⟩}`` is no longer a function of the angle alone; a harmonic
expansion would change the field there by ``O(|x| − 1)``, the polynomial of ``s`` does not. The
bound holds for every pair with ``|⟨u_i, u_j⟩| <= SHELL``, i.e. wherever the field is evaluated
with every ``|x_i| <= STAGE_RADIUS`` (``SHELL = STAGE_RADIUS²``): the stages of RK4 and
Dormand–Prince lie off the sphere by ``O(dt² |v|²)`` (radii up to 1.0011 measured in the
experiments), far inside 1.1. (A shell of 1.05 covered only ``|x| <= 1.0247``; at ``|x| = 1.1``
its error was 128 times the bound.) ``tail_bound(β, L, shell=r²)`` is the bound at radius ``r``.
The monomial coefficients of the economised polynomial are tame: ``Σ_k |c_k| a^k`` stays within a
few units of ``e^{β(a−1)}`` (so round-off is not amplified), tested.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from numpy.polynomial import chebyshev

STAGE_RADIUS = 1.1  # the bound holds wherever the field is evaluated with every |x_i| <= STAGE_RADIUS
SHELL = STAGE_RADIUS**2  # ... since |<u_i, u_j>| <= |x_i| |x_j| (the gauge is orthogonal)
MAX_DEGREE = 200


def tail_bound(beta: float, degree: int, *, shell: float = SHELL) -> float:
    """Closed-form bound on ``sup_{|s|<=shell} |p_L(s) − e^{β(s−1)}|`` for ``L = degree``.

    ``2 e^{−β} Σ_{k>L} I_k(z)``, ``z = β·shell``, with ``I_k(z) <= (z/2)^k/k! · e^{z²/(4(k+1))}``
    and the ratio of consecutive bounds at most ``q = z / (2(L+2))`` past ``L + 1`` (a geometric
    tail while ``q < 1``; ``inf`` otherwise).
    """
    z = beta * shell
    k = degree + 1
    q = z / (2.0 * (k + 1))
    if q >= 1.0:
        return math.inf
    log_first = k * math.log(z / 2.0) - math.lgamma(k + 1) + z * z / (4.0 * (k + 1)) - beta
    return 2.0 * math.exp(log_first) / (1.0 - q)


def exact_tail(beta: float, degree: int, *, shell: float = SHELL) -> float:
    """The tail ``2 e^{−β} Σ_{k>L} I_k(β·shell)`` itself (summed with SciPy), to report by how much
    ``tail_bound`` overestimates it."""
    import scipy.special  # SciPy is imported where it is used: a run's start-up does not pay for it

    z = beta * shell
    ks = np.arange(degree + 1, degree + 200)
    return float(2.0 * np.sum(scipy.special.ive(ks, z)) * np.exp(z - beta))


def monomial_coefficients(beta: float, degree: int, *, shell: float = SHELL) -> np.ndarray:
    """``c_0 … c_L`` of ``p_L(s) = Σ c_k s^k``, the degree-``L`` Chebyshev truncation of
    ``e^{β(s−1)}`` on ``[−shell, shell]``."""
    import scipy.special

    z = beta * shell
    cheb = 2.0 * scipy.special.ive(np.arange(degree + 1), z) * np.exp(z - beta)
    cheb[0] /= 2.0
    return chebyshev.cheb2poly(cheb) / shell ** np.arange(degree + 1)


def monomial_exponents(d: int, degree: int) -> np.ndarray:
    """All multi-indices ``α ∈ N^d`` with ``|α| <= degree``, shape ``(C(degree + d, d), d)``, in the
    order in which ``monomial_features`` builds them: by degree, and within a degree those of degree
    ``k`` with first variable ``m`` are ``e_m`` + the degree ``k − 1`` ones with variables ``>= m``."""
    previous = [[np.zeros(d, dtype=int)] for _ in range(d)]  # degree k − 1, variables >= m
    rows = [np.zeros(d, dtype=int)]
    for _ in range(degree):
        current = [None] * d
        for m in reversed(range(d)):
            unit = np.eye(d, dtype=int)[m]
            current[m] = [unit + p for p in previous[m]] + (current[m + 1] if m + 1 < d else [])
        rows.extend(current[0])
        previous = current
    return np.asarray(rows, dtype=int).reshape(-1, d)


def feature_weights(exponents: np.ndarray, coefficients: np.ndarray) -> np.ndarray:
    """``weight_α = c_{|α|} · |α|! / Π α_m!``: ``p_L(⟨u,v⟩) = Σ_α weight_α u^α v^α``."""
    import scipy.special

    total = exponents.sum(axis=1)
    log_multinomial = scipy.special.gammaln(total + 1) - scipy.special.gammaln(exponents + 1).sum(axis=1)
    return coefficients[total] * np.exp(log_multinomial)


def rank(d: int, degree: int) -> int:
    """The number of features ``C(degree + d, d)``."""
    return math.comb(degree + d, d)


def monomial_features(u: jnp.ndarray, degree: int) -> jnp.ndarray:
    """``F[i, r] = Π_m u[i, m]^{α_r,m}`` for the exponents ``α = monomial_exponents(d, degree)``,
    shape ``(n, R)``: :func:`graded_monomials` of ``uᵀ``, transposed."""
    return graded_monomials(u.T, degree).T


def graded_monomials(rows: jnp.ndarray, degree: int) -> jnp.ndarray:
    """The monomials of ``rows (m, c)`` (``m`` variables, ``c`` points), one row per exponent of
    ``monomial_exponents(m, degree)``: shape ``(C(degree + m, m), c)``. Each is a product of at
    most ``min(degree, m)`` powers ``x_j^k`` (one per variable it contains), gathered from the table
    of all powers: rows, not columns, so each product is a contiguous vector over the points."""
    m, c = rows.shape
    exponents = monomial_exponents(m, degree) if m else np.zeros((1, 0), dtype=int)
    factors = max(1, min(degree, m))
    # index of x_j^k in the table [1, x_1, …, x_1^L, x_2, …, x_m^L]: 1 + j L + (k − 1); 0 for 1
    index = np.zeros((exponents.shape[0], factors), dtype=np.int32)
    for row, alpha in enumerate(exponents):
        (present,) = np.nonzero(alpha)
        index[row, : present.size] = 1 + present * degree + alpha[present] - 1
    powers = [jnp.ones((1, c), rows.dtype)]
    if degree:
        power = rows
        for _ in range(degree):
            powers.append(power)
            power = power * rows
        powers = [powers[0], jnp.stack(powers[1:], axis=1).reshape(m * degree, c)]
    table = jnp.concatenate(powers, axis=0)
    return jnp.prod(table[jnp.asarray(index)], axis=1)


def split_exponents(d: int, degree: int) -> np.ndarray:
    """The exponents ``(a, β)`` of the split features, shape ``(G, L + 1, d)``: ``a = 0 … L`` the power
    of the first variable, ``β`` (row ``g``) the ``G = C(L + d − 1, d − 1)`` exponents of
    ``monomial_exponents(d − 1, L)`` for the others. Every ``α`` with ``|α| <= L`` is one of them
    (``a + |β| <= L``); the others (``a + |β| > L``) get weight 0 (``split_weights``)."""
    rest = monomial_exponents(d - 1, degree) if d > 1 else np.zeros((1, 0), dtype=int)
    powers = np.arange(degree + 1)
    grid = np.empty((rest.shape[0], degree + 1, d), dtype=int)
    grid[:, :, 0] = powers[None, :]
    grid[:, :, 1:] = rest[:, None, :]
    return grid


def split_weights(d: int, degree: int, coefficients: np.ndarray) -> np.ndarray:
    """``weight_α`` (``feature_weights``) on the grid of ``split_exponents``, ``(G, L + 1)``, and 0
    where ``|α| > L``: ``p_L(⟨u, v⟩) = Σ_{g,a} W_ga T_g(u) u_1^a T_g(v) v_1^a`` (``split_features``)."""
    grid = split_exponents(d, degree)
    flat = grid.reshape(-1, d)
    inside = flat.sum(axis=1) <= degree
    weights = np.zeros(flat.shape[0])
    weights[inside] = feature_weights(flat[inside], coefficients)
    return weights.reshape(grid.shape[:2])


def split_features(rows: jnp.ndarray, degree: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """The two factors of the split features of points ``rows (d, c)``: ``T (G, c)``, the monomials
    of the last ``d − 1`` variables (:func:`graded_monomials`), and ``P (L + 1, c)``, the powers of the
    first one; the monomial ``(a, β)`` of ``split_exponents`` is ``T_β P_a``."""
    powers = [jnp.ones_like(rows[0])]
    for _ in range(degree):
        powers.append(powers[-1] * rows[0])
    return graded_monomials(rows[1:], degree), jnp.stack(powers)
