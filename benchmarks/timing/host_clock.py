"""Host-clock timing of jitted calls on the CPU: interleaved rounds, so a drift of the machine
(another process, a thermal step) spreads over every variant instead of landing on one."""

from __future__ import annotations

import time

import jax


def interleaved(calls: dict, rounds: int, warmup: int = 1,
                before_each=None) -> dict[str, list[float]]:
  """Seconds per call of each zero-argument callable, `rounds` times in turn after `warmup`
  untimed rounds (compilation); each call's results are waited for. `before_each()`, if given,
  runs untimed before every call (e.g. `evict_caches`)."""
  times = {name: [] for name in calls}
  for r in range(warmup + rounds):
    for name, call in calls.items():
      if before_each is not None:
        before_each()
      start = time.perf_counter()
      jax.block_until_ready(call())
      if r >= warmup:
        times[name].append(time.perf_counter() - start)
  return times


class CacheEvictor:
  """Writes a buffer larger than the CPU's caches, so that the next call starts with none of its
  data cached, whatever ran before it (each implementation then finds the same state: in a
  sweep, the one timed right after another that read the same rows would find them cached)."""

  def __init__(self, mib: int = 64):
    import numpy as np  # pylint: disable=import-outside-toplevel
    self._buffer = np.zeros(mib << 18, np.float32)

  def __call__(self):
    self._buffer += 1.0
