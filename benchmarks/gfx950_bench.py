"""gfx950 timings (needs an MI355X with AMD's code objects; refuses to run elsewhere).

  compare: the split path (`decode`) against the persistent path (`decode_persistent`) at
           H = 128, one token per row, over a grid of (num_seqs, KV length). Interleaved rounds,
           medians, and a two-sided significance test (Mann-Whitney, or a permutation test
           without scipy) per config.
  fit:     times `decode` at forced split counts over a (num_seqs, H, K, S) sweep and fits the
           planner's latency model (benchmarks/timing/latency_fit.py) by least squares; writes the
           per-arch JSON table (`--out`), loadable with latency_fit.load_table into
           planner.LATENCY_MODEL_COEFFS.

Usage:
  python benchmarks/gfx950_bench.py compare [--rounds 30]
  python benchmarks/gfx950_bench.py fit --out gfx950_latency.json [--rounds 15]

The statistics and the fit are unit-tested on CPU (tests/test_latency_fit.py); nothing here has
been run on hardware yet.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_mla
from jax_mla._src import backends
from timing import latency_fit, timing_stats


def problem(num_seqs, num_heads, kv_len, pool_rows=65536, seed=0):
  """Device arrays for one decode: random packed rows, kv_len random pool rows per sequence."""
  key = jax.random.PRNGKey(seed)
  kq, kk, ki = jax.random.split(key, 3)
  q, q_rope = jax_mla.pack_rows(jax.random.normal(kq, (num_seqs, num_heads, 512)))
  kv, kv_rope = jax_mla.pack_rows(jax.random.normal(kk, (pool_rows, 512)))
  kv_indptr = jnp.arange(num_seqs + 1, dtype=jnp.int32) * kv_len
  kv_indices = jax.random.randint(ki, (num_seqs * kv_len,), 0, pool_rows, jnp.int32)
  return q, q_rope, kv, kv_rope, kv_indptr, kv_indices, jnp.zeros((num_heads,), jnp.float32)


def time_us(fn, *args):
  t0 = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return (time.perf_counter() - t0) * 1e6


def interleaved(fns: dict, rounds: int):
  """{name: [us per round]}; every round runs every fn once, in a rotating order."""
  for fn in fns.values():
    jax.block_until_ready(fn())  # compile and warm up
    jax.block_until_ready(fn())
  times = {name: [] for name in fns}
  names = list(fns)
  for r in range(rounds):
    for name in names[r % len(names):] + names[:r % len(names)]:
      times[name].append(time_us(fns[name]))
  return times


def compare(args):
  print("num_seqs kv_len  split_us  persistent_us  ratio  p  test")
  for num_seqs, kv_len in itertools.product(args.seqs, args.kv_lens):
    inputs = problem(num_seqs, 128, kv_len)
    split = jax.jit(lambda *a: jax_mla.decode(*a, backend="gfx950"))
    persistent = jax.jit(lambda *a: jax_mla.decode_persistent(*a, backend="gfx950"),
                         donate_argnums=(7,))
    state = {"ws": jax_mla.make_workspace(128, max(num_seqs, 1))}

    def run_persistent():
      out, lse, state["ws"] = persistent(*inputs, state["ws"])
      return out, lse

    t = interleaved({"split": lambda: split(*inputs), "persistent": run_persistent}, args.rounds)
    c = timing_stats.compare(t["split"], t["persistent"])
    print(f"{num_seqs:8d} {kv_len:6d} {c.median_a:9.1f} {c.median_b:14.1f} {c.ratio:6.3f} "
          f"{c.p_value:.2g} {c.test}{'' if c.significant() else '  (not significant)'}")


def fit(args):
  points = []
  for num_seqs, num_heads, kv_len in itertools.product(args.seqs, args.heads, args.kv_lens):
    inputs = problem(num_seqs, num_heads, kv_len)
    fns = {}
    for s in args.splits:
      # At S = 1 the kernel writes no LSE: time it with return_lse=False, as the planner runs it.
      fns[s] = (lambda s=s: jax.jit(lambda *a: jax_mla.decode(
          *a, backend="gfx950", num_kv_splits=s, return_lse=s > 1)))()
    t = interleaved({s: (lambda f=f: f(*inputs)) for s, f in fns.items()}, args.rounds)
    for s, samples in t.items():
      points.append(latency_fit.Measurement(num_seqs, num_heads, kv_len, s,
                                            statistics.median(samples)))
      print(f"num_seqs={num_seqs} H={num_heads} K={kv_len} S={s}: "
            f"{statistics.median(samples):.1f} us", flush=True)
  result = latency_fit.fit(points, arch="gfx950", default_kv_len=args.default_kv_len)
  print(f"fit over {result.num_points} points: {result.coeffs}; relative error rms "
        f"{result.rms_relative_error:.3f}, max {result.max_relative_error:.3f}")
  with open(args.out, "w", encoding="utf-8") as f:
    f.write(latency_fit.table_json({"gfx950": result}))
  print(f"wrote {args.out}")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  sub = p.add_subparsers(dest="command", required=True)
  c = sub.add_parser("compare")
  c.add_argument("--seqs", type=int, nargs="+", default=[1, 8, 64, 256, 1024])
  c.add_argument("--kv-lens", type=int, nargs="+", default=[128, 2048, 8192])
  c.add_argument("--rounds", type=int, default=30)
  f = sub.add_parser("fit")
  f.add_argument("--out", required=True)
  f.add_argument("--seqs", type=int, nargs="+", default=[1, 4, 32, 128, 512])
  f.add_argument("--heads", type=int, nargs="+", default=[16, 64, 128])
  f.add_argument("--kv-lens", type=int, nargs="+", default=[256, 2048, 8192])
  f.add_argument("--splits", type=int, nargs="+", default=list(range(1, 17)))
  f.add_argument("--default-kv-len", type=int, default=2048)
  f.add_argument("--rounds", type=int, default=15)
  args = p.parse_args(argv)
  ok, why = backends.gfx950_available()
  if not ok:
    print(f"gfx950_bench: needs an MI355X with AMD's code objects: {why}", file=sys.stderr)
    return 2
  np.random.seed(0)
  compare(args) if args.command == "compare" else fit(args)  # pylint: disable=expression-not-assigned
  return 0


if __name__ == "__main__":
  sys.exit(main())
