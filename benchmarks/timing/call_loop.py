"""The loop every GPU benchmark times: `steps` calls of a decode in one jitted fori_loop, the KV
indices moved on every call so that no call is loop-invariant.

Each call's output is the loop's carry (the next call replaces it; the last is returned), so
every call stays live and the loop runs no kernel of its own besides the index update that the
benchmarks time alone and net out. (Until 2026-12-04 the loops added one element of each output
to a sum instead: a kernel per call of about 1.1 us on the H200, charged to the decode; an
unrolled loop measured the same as a fori_loop on the H200, 2026-12-02, and compiles `steps`
times slower.)
"""

from __future__ import annotations

STRIDE = 4099  # odd: (index + step * STRIDE) mod a power of two permutes the pool


def moved(indices, step, pool: int):
  """indices moved on by `step` strides within a pool of `pool` rows (a power of two)."""
  if pool & (pool - 1):
    raise ValueError(f"the pool's rows must be a power of two, got {pool}")
  return (indices + step * STRIDE) & (pool - 1)


def looped(call, steps: int):
  """jitted run(*args) -> the output of call(steps - 1, *args), calls 0 .. steps - 1 run in
  turn, each output the next one's carry (the first call's output is the loop's initial carry,
  so the carry has the output's type and sharding whatever it is); call(step, *args) returns
  an array or a pytree of them."""
  import jax  # pylint: disable=import-outside-toplevel
  if steps < 1:
    raise ValueError(f"steps must be at least 1, got {steps}")

  @jax.jit
  def run(*args):
    return jax.lax.fori_loop(1, steps, lambda i, _: call(i, *args), call(0, *args))
  return run
