"""Where the work of a run goes: one decision per process, read by every module that needs it.

- **CPU**: a batch of seeds runs one seed at a time (``lax.map`` of the unbatched program, so each
  seed is bitwise a single run), shared between single-threaded worker processes when more than
  one core is available (:mod:`attnflow.numerics.batch`); tiled sums are dealt into lanes over the
  CPU devices (:mod:`attnflow.numerics.lanes`).
- **Accelerator** (GPU, TPU): a batch is one ``vmap``, in this process (no worker processes: one
  device is shared better by one program than by several processes); lanes run on one device;
  with more than one device, ``build`` shards the tokens of a run over all of them
  (:mod:`attnflow.numerics.sharding`: the field's sums split by rows, the state replicated).

``current()`` is the decision, made once from JAX's default backend the first time it is asked.
``placed(placement)`` overrides it inside a block, so that the accelerator branches run, and are
tested, on a CPU (their results equal the CPU ones to round-off: a ``vmap`` regroups nothing in
the per-seed arithmetic, but XLA may fuse the batched program differently).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator

import jax

PLATFORMS = ("cpu", "gpu", "tpu")


@dataclasses.dataclass(frozen=True)
class Placement:
    """The platform the programs run on (``"cpu"``, ``"gpu"`` or ``"tpu"``) and its device count."""

    platform: str
    devices: int = 1

    def __post_init__(self) -> None:
        if self.platform not in PLATFORMS:
            raise ValueError(f"placement: `platform` must be one of {PLATFORMS}; got {self.platform!r}.")
        if not (isinstance(self.devices, int) and self.devices >= 1):
            raise ValueError(f"placement: `devices` must be a whole number >= 1; got {self.devices!r}.")

    @property
    def accelerator(self) -> bool:
        return self.platform != "cpu"

    @property
    def vmap_batches(self) -> bool:
        """A batch of seeds is one ``vmap`` (accelerators), not a ``lax.map`` of single runs (CPU)."""
        return self.accelerator

    @property
    def shards_tokens(self) -> bool:
        """A run's tokens are sharded over the devices (an accelerator with more than one); on a
        CPU the cores already share the sums (lanes, worker processes)."""
        return self.accelerator and self.devices > 1

    @property
    def worker_processes(self) -> bool:
        """Batches and reproduce's jobs may be shared between single-threaded worker processes."""
        return not self.accelerator


_OVERRIDE: list[Placement] = []


@functools.cache
def _detected() -> Placement:
    backend = jax.default_backend()
    platform = backend if backend in PLATFORMS else "gpu"  # e.g. "cuda"/"rocm" plugins
    return Placement(platform, devices=jax.device_count())


def current() -> Placement:
    """This process's placement: the innermost ``placed`` block's, else the one detected once."""
    return _OVERRIDE[-1] if _OVERRIDE else _detected()


@contextlib.contextmanager
def placed(placement: Placement) -> Iterator[Placement]:
    """Run the block as if on ``placement`` (tests run the accelerator branches on a CPU)."""
    _OVERRIDE.append(placement)
    try:
        yield placement
    finally:
        _OVERRIDE.pop()
