"""A seed worker that dies mid-batch: one clear line, not a BrokenProcessPool traceback."""

import sys
from concurrent.futures.process import BrokenProcessPool

import jax
import jax.numpy as jnp
import pytest

from attnflow.core import factors, gauges
from attnflow.core.kernel import Kernel, make_profile
from attnflow.core.sphere import sample_uniform
from attnflow.numerics import dynamics, integrators
from attnflow.numerics.solve import SeedWorkerDied, solve
from test_batch import _kill_a_worker_later


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_seed_worker_is_one_line_naming_the_lost_seeds():
    n = 12
    kernel = Kernel(gauges.IdentityGauge(n, 3), factors.NoFactor(n), make_profile("exp", beta=1.0))
    field = dynamics.make_vector_field(kernel, normalization="sa")
    x0 = jnp.stack([sample_uniform(s, n, 3) for s in range(4)])
    seen: list[set[int]] = []
    _kill_a_worker_later(seen)  # SIGKILL to one of the two workers, 1 s after both started
    with pytest.raises(SeedWorkerDied) as caught:
        # far longer than the kill's delay: the workers are still integrating when one dies
        solve(field, x0, integrator=integrators.make_integrator("rk4"), dt=1e-4, t_end=1e3, save_every=100.0,
              key=jax.random.key(0), workers=2)  # fmt: skip
    message = str(caught.value)
    assert "\n" not in message and message.startswith("solve: a seed worker process died")
    assert "seeds 0-1" in message or "seeds 2-3" in message or "seeds 0-1, 2-3" in message
    assert 'a script must call solve under `if __name__ == "__main__":`' in message  # the other cause
    assert isinstance(caught.value, BrokenProcessPool)  # callers catching the pool's error still do


def test_a_dead_seed_worker_reaches_the_command_line_as_one_line_and_exit_3(capsys):
    import typer

    from attnflow.cli import EXIT_UNFINISHED, user_errors
    from attnflow.numerics.solve import SeedWorkerDied

    line = "solve: a seed worker process died before returning seeds 2-3 of 4."
    with pytest.raises(typer.Exit) as stop, user_errors():
        raise SeedWorkerDied(line)
    assert stop.value.exit_code == EXIT_UNFINISHED == 3
    assert capsys.readouterr().err == f"error: {line}\n"
