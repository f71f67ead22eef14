"""The outcome of one run, as diffrax's ``RESULTS``: a status whose message is the remedy.

``Status`` is a ``str`` enum: ``Status.nonfinite == "nonfinite"``, it prints, formats and serialises
(JSON, zarr attributes) as its name, and ``status.message`` says what happened and what to do.
Inside compiled code a status is its ``code`` (an int), turned into a ``Status`` at the edge.

``under_resolved`` is a density run's (``density_circle.status_code``, ``density_sphere.status_code``);
it comes after the particles' statuses so that their codes stay what they were.
"""

from __future__ import annotations

import enum

import numpy as np


class Status(enum.StrEnum):
    """A run's outcome. ``message``: what happened, and the remedy."""

    ok = "ok"
    nonfinite = "nonfinite"
    max_steps = "max_steps"
    under_resolved = "under_resolved"

    @property
    def message(self) -> str:
        return _MESSAGES[self]

    @property
    def code(self) -> int:
        return list(Status).index(self)

    @classmethod
    def from_codes(cls, codes) -> np.ndarray:
        """``Status`` objects (an object array of the same shape) from compiled status codes."""
        members = list(cls)
        codes = np.asarray(codes)
        return np.asarray([members[c] for c in codes.ravel()], dtype=object).reshape(codes.shape)


_MESSAGES = {
    Status.ok: "the run reached t_end.",
    Status.nonfinite: (
        "the state left the reals (NaN or inf), or a Runge–Kutta stage of the expansion left the radius "
        "1.1 where its error bound holds: reduce `dt` or `beta`, or use float64; the run stops at its last "
        "finite snapshot."
    ),
    Status.max_steps: (
        "the adaptive controller ran out of steps (`max_steps_per_snapshot` before a snapshot, or "
        "`max_steps` in all: `solver.max_steps` in a config): raise the bound, loosen `rtol`/`atol`, or "
        "use a fixed-step method."
    ),
    Status.under_resolved: (
        "the density concentrated below its grid's resolution (spectral energy in the top third of the "
        "modes, or negative mass, above its tolerance): the run stops at its last resolved snapshot; raise "
        "`density.grid` (or `density.lmax`), or stop earlier (slices of the mean-field law become Diracs)."
    ),
}
