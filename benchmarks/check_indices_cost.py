"""What `check_indices=True` costs: jitted decode with and without it, interleaved rounds, medians.

The checked variant runs under `checkify.checkify` (how a jitted caller uses it) and includes
`err.throw()`. Also times the checks alone. Usage:
  python benchmarks/check_indices_cost.py [--backend host] [--seqs 8] [--kv-len 2048] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np
from jax.experimental import checkify

import jax_mla
from jax_mla._src import index_checks


def main():
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument("--backend", default="host")
  p.add_argument("--seqs", type=int, default=8)
  p.add_argument("--heads", type=int, default=128)
  p.add_argument("--kv-len", type=int, default=2048, help="KV entries per sequence (top-k)")
  p.add_argument("--pool-rows", type=int, default=65536)
  p.add_argument("--rounds", type=int, default=15)
  a = p.parse_args()

  rng = np.random.default_rng(0)
  q = rng.integers(0, 0x70, (a.seqs, a.heads, 512), dtype=np.uint8)
  q_rope = np.zeros((a.seqs, a.heads, 64), jax.numpy.bfloat16)
  kv = rng.integers(0, 0x70, (a.pool_rows, 512), dtype=np.uint8)
  kv[:, 448:462] = 120  # scales 2^-7
  q[..., 448:462] = 120
  kv_rope = np.zeros((a.pool_rows, 64), jax.numpy.bfloat16)
  kv_indptr = (np.arange(a.seqs + 1) * a.kv_len).astype(np.int32)
  kv_indices = rng.integers(0, a.pool_rows, a.seqs * a.kv_len, dtype=np.int32)
  args = [jax.device_put(x) for x in (q, q_rope, kv, kv_rope, kv_indptr, kv_indices)]

  plain = jax.jit(lambda *x: jax_mla.decode(*x, backend=a.backend))
  checked_fn = jax.jit(checkify.checkify(
      lambda *x: jax_mla.decode(*x, backend=a.backend, check_indices=True),
      errors=checkify.user_checks))
  checks_only = jax.jit(checkify.checkify(
      lambda ptr, idx: index_checks.checked_kv_indptr(ptr, idx, a.pool_rows, zero_start=True),
      errors=checkify.user_checks))

  def checked(*x):
    err, out = checked_fn(*x)
    err.throw()
    return out

  def only():
    err, out = checks_only(args[4], args[5])
    err.throw()
    return out

  runs = {"without": lambda: plain(*args), "with": lambda: checked(*args), "checks only": only}
  for f in runs.values():
    jax.block_until_ready(f())  # compile
  times = {k: [] for k in runs}
  for _ in range(a.rounds):
    for name, f in runs.items():  # interleaved, so drift hits every variant alike
      t0 = time.perf_counter()
      jax.block_until_ready(f())
      times[name].append(time.perf_counter() - t0)
  med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
  print(f"backend={a.backend} seqs={a.seqs} heads={a.heads} kv_len={a.kv_len} "
        f"pool_rows={a.pool_rows} rounds={a.rounds}")
  for k, v in med.items():
    print(f"  {k:12s} median {v:9.3f} ms  (min {min(times[k]) * 1e3:.3f} ms)")
  print(f"  overhead: {med['with'] - med['without']:+.3f} ms "
        f"({(med['with'] / med['without'] - 1) * 100:+.2f} %)")


if __name__ == "__main__":
  main()
