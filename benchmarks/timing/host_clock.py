"""Host-clock timing of jitted calls on the CPU: interleaved rounds, so a drift of the machine
(another process, a thermal step) spreads over every variant instead of landing on one."""

from __future__ import annotations

import time

import jax


def interleaved(calls: dict, rounds: int, warmup: int = 1) -> dict[str, list[float]]:
  """Seconds per call of each zero-argument callable, `rounds` times in turn after `warmup`
  untimed rounds (compilation); each call's results are waited for."""
  times = {name: [] for name in calls}
  for r in range(warmup + rounds):
    for name, call in calls.items():
      start = time.perf_counter()
      jax.block_until_ready(call())
      if r >= warmup:
        times[name].append(time.perf_counter() - start)
  return times
