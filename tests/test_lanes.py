"""Lanes (attnflow.numerics.lanes): the round-robin deal, the lane-ordered sum, and the device set-up.

That the results do not depend on the number of CPU devices is checked end to end, in fresh
processes, by ``test_performance.test_results_independent_of_thread_settings_and_devices``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.numerics import lanes


@pytest.mark.parametrize("k", [1, 5, 8, 13, 16, 45])
def test_deal_is_round_robin_and_covers_every_item_once(k):
    items = np.arange(10, 10 + k)
    dealt, real = lanes.deal(items)
    per = -(-k // lanes.LANES)
    assert dealt.shape == real.shape == (lanes.LANES, per)
    assert sorted(dealt[real].tolist()) == items.tolist()  # every item exactly once
    assert real.sum() == k and np.all(dealt[~real] == items[0])  # padding: copies of item 0, masked
    for lane in range(lanes.LANES):
        assert dealt[lane][real[lane]].tolist() == items[lane :: lanes.LANES].tolist()


def test_deal_keeps_trailing_axes():
    pairs = np.stack(np.triu_indices(4), axis=1)  # 10 tile pairs
    dealt, real = lanes.deal(pairs)
    assert dealt.shape == (lanes.LANES, 2, 2) and real.shape == (lanes.LANES, 2)
    assert {tuple(p) for p in dealt[real]} == {tuple(p) for p in pairs}


def test_lane_sum_adds_the_lanes_in_lane_order():
    values = jnp.asarray(np.random.default_rng(0).standard_normal((lanes.LANES, 3, 2)))

    def lane_fn(scale, lane):
        return jax.lax.scan(lambda acc, v: (acc + scale * v, None), jnp.zeros(2), lane)[0]

    total = jax.jit(lambda v: lanes.lane_sum(lane_fn, 2.0, v))(values)
    expected = 2.0 * values[0].sum(axis=0)
    for lane in range(1, lanes.LANES):
        expected = expected + 2.0 * values[lane].sum(axis=0)
    np.testing.assert_allclose(total, expected, rtol=1e-15)


def test_lane_map_stacks_lanes_of_a_pytree():
    ids = jnp.arange(lanes.LANES * 2).reshape(lanes.LANES, 2)
    out = lanes.lane_map(lambda ops, lane: {"a": lane * ops, "b": lane.sum()}, 3, ids)
    np.testing.assert_array_equal(out["a"], 3 * ids)
    np.testing.assert_array_equal(out["b"], ids.sum(axis=1))


_DEVICES_SCRIPT = textwrap.dedent(
    """
    import sys
    import jax
    import numpy as np
    from attnflow.numerics import lanes
    assert lanes.use_cpu_cores(int(sys.argv[1])) == int(sys.argv[1])
    values = np.random.default_rng(0).standard_normal((lanes.LANES, 5, 3))
    fold = lambda ops, lane: jax.lax.scan(lambda acc, v: (acc * ops + v, None), jax.numpy.zeros(3), lane)[0]
    total = jax.jit(lambda v: lanes.lane_sum(fold, 0.9, v))(values)
    print(len(lanes.lane_devices()), *np.asarray(total).tobytes().hex().split())
    """
)


@pytest.mark.slow
def test_lane_devices_are_the_largest_divisor_and_the_sum_does_not_depend_on_them(tmp_path):
    """With 3 CPU devices the lanes run on 2 (the largest divisor of LANES = 8 that fits), with 1 on
    one; the lane sum is bitwise the same (the lanes' layout never depends on the devices)."""
    script = tmp_path / "devices.py"
    script.write_text(_DEVICES_SCRIPT)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    outputs = {}
    for count in (1, 3):
        done = subprocess.run([sys.executable, str(script), str(count)], env=env, capture_output=True,
                              text=True, timeout=300, check=True)  # fmt: skip
        outputs[count] = done.stdout.split()
    assert outputs[1][0] == "1" and outputs[3][0] == "2"
    assert outputs[1][1:] == outputs[3][1:]  # bitwise


def test_use_cpu_cores_after_start():
    jnp.zeros(1).block_until_ready()  # the backend is running in the test process
    have = len(jax.devices("cpu"))
    assert lanes.use_cpu_cores() == have and lanes.use_cpu_cores(have) == have
    with pytest.raises(RuntimeError, match=rf"use_cpu_cores: JAX has already started with {have} CPU"):
        lanes.use_cpu_cores(have + 1)
    with pytest.raises(ValueError, match=r"use_cpu_cores: `count` must be a positive integer; got 0\."):
        lanes.use_cpu_cores(0)


def test_scan_dealt_folds_the_real_items_in_order_and_skips_the_padding():
    items, real = lanes.deal(np.arange(1.0, 12.0))  # 11 items: 5 padding slots hold copies of item 0
    fold = lanes.scan_dealt(lambda ops, acc, item: ops * acc + item, init=lambda ops: jnp.zeros(()))
    out = lanes.lane_map(fold, 10.0, (jnp.asarray(items), jnp.asarray(real)))
    for lane in range(lanes.LANES):
        expected = 0.0
        for item in items[lane][real[lane]]:
            expected = 10.0 * expected + item  # a padding item folded in (item 0 = 1.0) would show
        assert float(out[lane]) == expected
