"""Why each of the paper's experiments matters: the claim it supports and what a failure would mean.

One text per experiment id, shown on the experiment's page of the docs site (``docs/hooks.py``) and
in its section of the reproduce report (:mod:`attnflow.viz.report`).
"""

from __future__ import annotations

__all__ = ["WHY"]

WHY: dict[str, str] = {
    "E0": "The baseline. Without labels, attention dynamics collapse every token to one point (a "
    "Dirac); the collapse times measured here are the reference every gauge experiment is compared to. "
    "If E0 failed, nothing else could be read: the simulator would not reproduce the known behaviour.",
    "E1": "The central claim on the most common positional encoding. A RoPE label does not stop the "
    "gauge frame u_i = Q(ξ_i) x_i from collapsing exactly like E0, but the content x_i = Q(ξ_i)ᵀ u* "
    "then lies on a latitude circle, not at a point: the labels prevent mode collapse. A failure "
    "(a Dirac, or a gauge frame that does not collapse) would contradict the gauge conjugacy.",
    "E2": "The same mechanism with non-commuting generators: the limit is a closed wavy curve, the "
    "orbit of u* under ξ ↦ Q(ξ)ᵀ. It shows that the outcome is dictated by the gauge, not by RoPE's "
    "special relative structure.",
    "E3": "Discrete labels (prompt ids) with Haar-random gauges: the tokens of each prompt collapse "
    "together, the prompts stay apart, so the state is K clusters ('conditional Diracisation'). "
    "A single cluster would mean the gauge is ignored.",
    "E4": "A non-negative factor (an ALiBi-type distance bias) acting on labels alone does not prevent "
    "collapse: the maximiser of the energy is still a Dirac. This is the negative half of the factor "
    "dichotomy: positional weights are not enough.",
    "E5": "The positive half of the dichotomy: a sign-changing factor w = cos 2π(ξ - ζ) makes a spread "
    "state (the uniform great circle) the maximiser at β = 1. Convergence is slow, so the experiment "
    "runs to τ = 100 and reports τ = 20 too.",
    "E6": "Metastability at large β: before the final collapse the dynamics linger on a few clusters "
    "(in the gauge frame), and the energy climbs in a staircase. It shows the long transients a "
    "finite-time reading of the model must account for.",
    "E7": "Universality on an orbit: reparametrising the RoPE phase makes the relative angles of the "
    "limit follow any target law on the circle, within the Kolmogorov–Smirnov distance 1/(2n) of the "
    "construction. The labels shape the limit law, not only prevent collapse.",
    "E8": "Gauge-level realisation on the sphere: with one gauge per token built from a target sample "
    "(Householder reflections), the dynamics reach the target law up to the global symmetry; from a cap "
    "around the reference, exactly. A failed realisation gives distances of order 1.",
    "E9": "The contrast. With the rotation only inside the logits (`value = logits_only`, as in a RoPE "
    "layer with V = I) the flow is no longer a gradient flow and the tokens do collapse. It shows that "
    "anti-collapse comes from the gauge acting on the values too.",
    "E10": "Causal attention collapses to its first token: the first token sees only itself and never "
    "moves, so every other token ends at its point, whatever the query and key maps. It checks the "
    "causal mask by its known limit (a leak through the mask would move the first token).",
    "E11": "Maps decide where a layer settles. With shared maps and rotated values the layer is a "
    "gradient flow whose energy never decreases and whose tokens end at the top eigenvector of W^T W; "
    "with independent Gaussian maps it is not, and the energy is seen to decrease: the monotone energy "
    "of E0-E9 is a property of the gradient case, not of attention.",
    "E12": "A held source is an attractor: tokens that attend to a fixed token gather and drift onto "
    "it, slowly (the source weighs 1/n). It checks that held sources stay put and pull the others.",
    "E13": "E1's orbit inside a layer of heads: with identity maps and rotated values a head is E1's "
    "field, so the gauge frame collapses and the content lies on the RoPE orbit. It ties the layer "
    "code to the model of E0-E9; with plain values (a RoPE layer) the orbit is not kept.",
    "E14": "The one closed form that pins β, the clock and the normalisation at once: tokens started "
    "with every pairwise cosine equal stay equiangular, and that cosine ρ(t) solves a scalar ODE "
    "whose solution depends on β, on the time scale and on usa versus sa. The particles must follow "
    "it to 1e-8 at several times, on the exact and on the expansion path. Most other experiments end "
    "in a β-independent state; a wrong β, a clock at half speed or a softmax computed as usa fails "
    "here.",
    "E15": "Where a layer norm puts the attention output changes only the speed of the flow. Tokens "
    "started equiangular stay so under post-, pre-, peri-LN and nGPT, and each norm closes an ODE for "
    "their cosine ρ(t) (and their radius r(t) under pre and peri): post and nGPT collapse "
    "exponentially, pre and peri like t^-2 because their tokens grow. With RoPE the gauge frame "
    "follows the same ODE under every norm, so the content still tends to the orbit Q(ξ_i)^T u*: the "
    "orbit limit survives each norm, only its speed changes. A dropped norm, a wrong β or a wrong "
    "clock fails here.",
    "E16": "The mean-field law itself, without finite-n noise. The density solver computes the law of "
    "the tokens per label; particles started from that law must approach it like n^-1/2 (here √n "
    "times the W1 distance stays about 2.5 from n = 192 to 768), and both solvers must grow the modes "
    "of the uniform law at the closed-form rates k² I_k(β)/β. It ties the particles to the limit "
    "they approximate: a wrong β or clock fails the rates, a gauge, label, value or factor done "
    "wrong moves the particle law away from the density.",
    "E17": "The settings of long-context models, checked against what the configuration promises. "
    "With Llama 3.1's RoPE (head dimension 128, base 500000, the llama3 rule that turns the slow pairs "
    "8 times slower) and 64 tokens spread over its 128k context, the gauge frame collapses as in E14 "
    "and the content ends on the orbit of the scaled frequencies, whose mean cosine is a number of the "
    "frequencies and the positions alone. With β = γ log n the equiangular cosine ρ(t) follows E14's "
    "ODE at that β, at n = 32 and 64. A build that drops the preset's scaling rule ends on another "
    "orbit; one that keeps β = model.beta gives another ρ(t). Both fail here, where every experiment "
    "before passes them.",
}
