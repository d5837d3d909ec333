"""Times the persistent path's empty-row fix-up alone on XLA:CPU: the select (host default) and
the uint16 scatter (gfx950 default) against doing nothing, on a donated bf16 out [N, 128, 512]
and f32 lse [N, 128]. Medians of interleaved rounds.

  PYTHONPATH=src python benchmarks/persistent_empty_row_fixup.py [--rows 64 2048] [--empty 0.25]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from jax_mla._src.persistent_kernel import _fix_empty_rows


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--rows", type=int, nargs="+", default=[64, 2048])
  ap.add_argument("--empty", type=float, default=0.25)
  ap.add_argument("--rounds", type=int, default=21)
  args = ap.parse_args()
  for n in args.rows:
    k = (np.random.default_rng(0).random(n) >= args.empty).astype(np.int32)
    indptr = jnp.asarray(np.concatenate([[0], np.cumsum(k)]).astype(np.int32))
    sink = jnp.zeros((128,), jnp.float32)
    fns = {
        "none": jax.jit(lambda o, l, i: (o, l), donate_argnums=(0, 1)),
        "select": jax.jit(lambda o, l, i: _fix_empty_rows(o, l, i, sink, "select"),
                          donate_argnums=(0, 1)),
        "scatter": jax.jit(lambda o, l, i: _fix_empty_rows(o, l, i, sink, "scatter"),
                           donate_argnums=(0, 1)),
    }
    state = {name: (jnp.ones((n, 128, 512), jnp.bfloat16), jnp.ones((n, 128), jnp.float32))
             for name in fns}
    times = {name: [] for name in fns}
    for r in range(args.rounds + 2):
      for name, fn in fns.items():
        t0 = time.perf_counter()
        state[name] = jax.block_until_ready(fn(*state[name], indptr))
        if r >= 2:
          times[name].append(time.perf_counter() - t0)
    mib = n * 128 * 512 * 2 / 2**20
    print(f"N={n} (out {mib:.0f} MiB), {int((k == 0).sum())} empty rows, {args.rounds} rounds:")
    for name, t in times.items():
      print(f"  {name:8s} median {np.median(t) * 1e3:8.3f} ms")


if __name__ == "__main__":
  main()
