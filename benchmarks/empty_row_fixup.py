"""What the empty-row fix-up of the aiter paths costs on XLA:CPU: the select (the host backend's
choice) and the uint16 scatter (gfx950's) against no fix-up, on a donated bf16 out [N, H, 512]
and f32 lse [N, H], medians of interleaved rounds (src/jax_mla/_src/aiter/empty_rows.py; the
figures quoted in docs/workspace.md and docs/split_path.md came from this measurement).

  python benchmarks/empty_row_fixup.py [--rows 64 2048] [--heads 128] [--empty 0.25]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from jax_mla._src.aiter import empty_rows
from timing import host_clock


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--rows", type=int, nargs="+", default=[64, 2048])
  ap.add_argument("--heads", type=int, default=128)
  ap.add_argument("--empty", type=float, default=0.25, help="fraction of empty rows")
  ap.add_argument("--rounds", type=int, default=21)
  args = ap.parse_args()
  h = args.heads
  for n in args.rows:
    k = (np.random.default_rng(0).random(n) >= args.empty).astype(np.int32)
    indptr = jnp.asarray(np.concatenate([[0], np.cumsum(k)]).astype(np.int32))
    sink = jnp.zeros((h,), jnp.float32)

    def fixed(method):
      return jax.jit(lambda o, l, i: empty_rows.fix(o, l, i, sink, tokens_per_seq=1,
                                                    method=method), donate_argnums=(0, 1))
    fns = {"none": jax.jit(lambda o, l, i: (o, l), donate_argnums=(0, 1)),
           "select": fixed("select"), "scatter": fixed("scatter")}
    state = {name: (jnp.ones((n, h, 512), jnp.bfloat16), jnp.ones((n, h), jnp.float32))
             for name in fns}

    def step(name):  # each call donates its buffers and keeps the results for the next
      def call():
        state[name] = fns[name](*state[name], indptr)
        return state[name]
      return call
    times = host_clock.interleaved({name: step(name) for name in fns}, args.rounds, warmup=2)
    mib = n * h * 512 * 2 / 2**20
    print(f"N={n}, H={h} (out {mib:.0f} MiB), {int((k == 0).sum())} empty rows, "
          f"{args.rounds} rounds:")
    for name, t in times.items():
      print(f"  {name:8s} median {np.median(t) * 1e3:8.3f} ms")


if __name__ == "__main__":
  main()
