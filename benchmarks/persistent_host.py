"""Times the persistent path on the host backend: with and without the empty-row fix-up, and
against the pure-JAX reference. Medians of interleaved rounds of jitted calls (after warm-up).

  PYTHONPATH=src:tests python benchmarks/persistent_host.py [--rows 64] [--kv 1024] [--empty 0.25]
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

import jax_mla
from jax_mla._src.aiter.persistent import decode_persistent_raw
from jax_mla._src.workspace import make_workspace
from support.rows import make_batch


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--rows", type=int, default=64)
  ap.add_argument("--kv", type=int, default=1024)
  ap.add_argument("--empty", type=float, default=0.25, help="fraction of rows with K = 0")
  ap.add_argument("--partitions", type=int, default=128)
  ap.add_argument("--rounds", type=int, default=7)
  ap.add_argument("--no-reference", action="store_true")
  args = ap.parse_args()

  rng = np.random.default_rng(0)
  lengths = np.full(args.rows, args.kv)
  lengths[: int(args.rows * args.empty)] = 0
  rng.shuffle(lengths)
  b = make_batch(rng, num_heads=128, lengths=lengths, pool_rows=max(args.kv, 64), sink=0.5)
  inputs = [jax.device_put(a) for a in b.args()]
  ws = make_workspace(args.partitions, args.rows)

  def persistent(fix):
    f = jax.jit(lambda ws, *a: decode_persistent_raw(*a, ws, fix_empty_rows=fix)[:2],)
    return lambda: f(ws, *inputs)

  variants = {
      "persistent, no fix-up": persistent(False),
      "persistent, select": persistent("select"),
      "persistent, scatter": persistent("scatter"),
  }
  if not args.no_reference:
    ref = jax.jit(lambda *a: jax_mla.decode(*a, backend="reference"))
    variants["reference"] = lambda: ref(*inputs)
  times = {k: [] for k in variants}
  for fn in variants.values():
    jax.block_until_ready(fn())
  for _ in range(args.rounds):
    for name, fn in variants.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn())
      times[name].append(time.perf_counter() - t0)
  print(f"N={args.rows} H=128 K={args.kv} empty={args.empty:.0%} P={args.partitions} "
        f"rounds={args.rounds}")
  for name, t in times.items():
    print(f"  {name:24s} median {np.median(t) * 1e3:9.2f} ms  (min {np.min(t) * 1e3:.2f})")


if __name__ == "__main__":
  main()
