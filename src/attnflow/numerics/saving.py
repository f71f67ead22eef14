"""Which states a run keeps: ``SaveAt`` (as diffrax's), snapshots at ``k · save_every`` up to ``t_end``.

The steps between two snapshots form a chunk; one compiled call advances ``snapshots_per_call``
chunks (``None``: chosen by ``snapshot_group`` so that a call does about ``SNAPSHOT_GROUP_WORK``
pair interactions, so that per-call overhead and host synchronisation stay negligible for small
``n``). Results do not depend on the grouping (tested).
"""

from __future__ import annotations

import dataclasses

from attnflow.core.constraints import TIME_GRID, whole_steps
from attnflow.core.pytree import pytree_dataclass

SNAPSHOT_GROUP_WORK = 2**26  # pair interactions per compiled call before snapshots are grouped
SNAPSHOT_GROUP_MAX = 64


def whole_multiple(name: str, total: float, step_name: str, step: float) -> int:
    """``total / step`` when it is a whole number >= 1, else the error naming both (the one rule
    of the time grid, :data:`attnflow.core.constraints.TIME_GRID`: snapshots on steps, ``t_end``
    on snapshots)."""
    TIME_GRID[name].check(total, where="solve", **{step_name: step})
    return whole_steps(total, step)


def snapshot_count(t_end: float, save_every: float) -> int:
    """Number of stored snapshots, the initial one included."""
    return int(round(t_end / save_every)) + 1


def snapshot_group(n_chunks: int, *, pairs_per_chunk: float, limit: int = SNAPSHOT_GROUP_MAX) -> int:
    """How many snapshots one compiled call advances: enough that a call does about
    ``SNAPSHOT_GROUP_WORK`` pair interactions, at most ``limit``, and a divisor of ``n_chunks`` (one
    executable serves the whole run)."""
    want = max(1, min(limit, -(-SNAPSHOT_GROUP_WORK // max(1, int(pairs_per_chunk)))))
    return max(g for g in range(1, want + 1) if n_chunks % g == 0) if n_chunks > 0 else 1


@pytree_dataclass(data_fields=["t_end", "save_every"], meta_fields=["snapshots_per_call"])
@dataclasses.dataclass(frozen=True)
class SaveAt:
    """Snapshots at ``0, save_every, ..., t_end`` (``t_end`` a whole multiple of ``save_every``);
    ``snapshots_per_call``: chunks per compiled call (a divisor of their number; None: automatic).
    A pytree whose leaves are ``t_end`` and ``save_every`` (arguments of ``solve``'s program)."""

    t_end: float
    save_every: float
    snapshots_per_call: int | None = None

    def __post_init__(self) -> None:
        if not self.save_every > 0:
            raise ValueError(f"solve: `save_every` must be positive; got {self.save_every!r}.")
        whole_multiple("t_end", self.t_end, "save_every", self.save_every)
        group = self.snapshots_per_call
        if group is not None and (
            isinstance(group, bool) or int(group) != group or group < 1 or self.chunks % group
        ):
            raise ValueError(
                f"solve: `snapshots_per_call` must be a positive divisor of the number of chunks "
                f"({self.chunks}); got {group!r}."
            )

    @property
    def count(self) -> int:
        """Stored snapshots, the initial one included."""
        return snapshot_count(self.t_end, self.save_every)

    @property
    def chunks(self) -> int:
        return self.count - 1

    def group(self, pairs_per_chunk: float | None) -> int:
        """Snapshots per compiled call: the given one, else automatic (1 when the work per chunk is
        unknown, e.g. adaptive steps)."""
        if self.snapshots_per_call is not None:
            return int(self.snapshots_per_call)
        if pairs_per_chunk is None:
            return 1
        return snapshot_group(self.chunks, pairs_per_chunk=pairs_per_chunk)

    def time(self, k: int) -> float:
        return k * self.save_every
