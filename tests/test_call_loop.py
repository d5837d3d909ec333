"""benchmarks/timing/call_loop.py: the loop the GPU benchmarks time."""

import jax.numpy as jnp
import numpy as np
import pytest

from timing import call_loop


def test_the_loop_returns_the_last_calls_output_and_runs_every_step():
  seen = []

  def call(i, x):
    seen.append(i)  # traced once: the loop's body and the first call
    return {"out": x * 0 + i, "sum": jnp.sum(x) + i}
  got = call_loop.looped(call, 5)(jnp.arange(4.0))
  np.testing.assert_array_equal(np.asarray(got["out"]), np.full(4, 4.0))
  assert float(got["sum"]) == 6.0 + 4
  assert len(seen) == 2


def test_one_step_is_the_call_itself():
  got = call_loop.looped(lambda i, x: x + i + 1, 1)(jnp.zeros(3))
  np.testing.assert_array_equal(np.asarray(got), np.ones(3))
  with pytest.raises(ValueError, match="at least 1"):
    call_loop.looped(lambda i, x: x, 0)


def test_moved_indices_permute_the_pool_every_step():
  pool = 256
  rows = np.arange(pool, dtype=np.int32)
  for step in (0, 1, 7):
    moved = np.asarray(call_loop.moved(jnp.asarray(rows), step, pool))
    assert sorted(moved.tolist()) == rows.tolist()
    assert step == 0 or not np.array_equal(moved, rows)
  with pytest.raises(ValueError, match="power of two"):
    call_loop.moved(jnp.asarray(rows), 1, 300)
