"""Times the persistent path on the host backend: with and without the empty-row fix-up, and
against the pure-JAX reference. Medians of interleaved rounds of jitted calls (after warm-up).

  python benchmarks/persistent_host.py [--rows 64] [--kv 1024] [--empty 0.25]

(The figures quoted in docs/workspace.md came from this measurement.)
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import jax_mla
from jax_mla._src.aiter.persistent import decode_persistent_raw
from timing import host_clock

HEADS = 128  # decode_persistent's only head count


def make_inputs(lengths, pool_rows, sink, seed=0):
  """Device arrays for one decode: random packed rows (scores O(1)), lengths[b] random pool rows
  for sequence b, the same sink for every head."""
  kq, kk, ki = jax.random.split(jax.random.PRNGKey(seed), 3)
  q, q_rope = jax_mla.pack_rows(jax.random.normal(kq, (len(lengths), HEADS, 512)) * 0.05)
  kv, kv_rope = jax_mla.pack_rows(jax.random.normal(kk, (pool_rows, 512)))
  kv_indptr = jnp.asarray(np.concatenate([[0], np.cumsum(lengths)]), jnp.int32)
  kv_indices = jax.random.randint(ki, (max(int(np.sum(lengths)), 1),), 0, pool_rows, jnp.int32)
  return q, q_rope, kv, kv_rope, kv_indptr, kv_indices, jnp.full((HEADS,), sink, jnp.float32)


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
  inputs = make_inputs(lengths, pool_rows=max(args.kv, 64), sink=0.5)
  ws = jax_mla.make_workspace(args.partitions, args.rows)

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
  times = host_clock.interleaved(variants, args.rounds)
  print(f"N={args.rows} H={HEADS} K={args.kv} empty={args.empty:.0%} P={args.partitions} "
        f"rounds={args.rounds}")
  for name, t in times.items():
    print(f"  {name:24s} median {np.median(t) * 1e3:9.2f} ms  (min {np.min(t) * 1e3:.2f})")


if __name__ == "__main__":
  main()
