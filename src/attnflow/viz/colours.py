"""One colour scheme for the label ``ξ`` (a position, a prompt id) in every picture attnflow draws.

The PNG figures, the ``attnflow animate`` movie, the viewer and the tutorial colour a token by
its label through :data:`LABEL_CMAP` (viridis: perceptually uniform, readable in grey and by
colour-blind readers, and dark at both ends on a white page, so no token fades into the
background). The label is mapped linearly from its smallest value (the first colour) to its
largest (the last colour): :func:`label_scale`. Every picture that colours by the label has a key:
a named colour bar in the figures and the movie, a gradient with its end values in the viewer.
"""

from __future__ import annotations

import numpy as np

__all__ = ["LABEL_CMAP", "LABEL_STOPS", "label_scale"]

LABEL_CMAP = "viridis"
"""The matplotlib colour map of the label, everywhere."""

LABEL_STOPS = (
    "#440154", "#482475", "#414487", "#355f8d", "#2a788e", "#21918c",
    "#22a884", "#44bf70", "#7ad151", "#bddf26", "#fde725",
)  # fmt: skip
""":data:`LABEL_CMAP` at 0, 0.1, ..., 1 (the viewer interpolates between them; a test checks
them against matplotlib's)."""


def label_scale(xi: np.ndarray) -> np.ndarray:
    """The label's values mapped to ``[0, 1]``: ``(ξ − min ξ) / (max ξ − min ξ)``, the position on
    :data:`LABEL_CMAP`; all zeros when every token has the same label."""
    xi = np.asarray(xi, dtype=np.float64)
    low, high = float(np.min(xi)), float(np.max(xi))
    if high == low:
        return np.zeros_like(xi)
    return (xi - low) / (high - low)
