"""The split merge alone: XLA's passes (pallas_merge.merge_partials) against the Pallas merge
kernel (pallas_merge.merge_kernel) and its tile choices, as GPU busy time per call.

Usage (on the GPU machine): python benchmarks/merge_bench.py [--out PREFIX]  (writes PREFIX.csv)
Each measurement is one jitted loop of --steps merges whose lse changes every step (so no
call is loop-invariant), timed by the profiler (device_time.py); the loop's own step (one
small elementwise pass over the lse) is in every figure alike. The shapes are those the
decode's split planner makes on an H200 (sequences, splits, rows).
"""

import argparse
import csv
import functools
import statistics

import jax
import jax.numpy as jnp
import numpy as np

import device_time
from jax_mla._src.pallas import merge as pallas_merge

# (sequences, splits, rows): 128 heads at B 1 (K 512 / 1024 / 2048), B 8, B 32; 16 x 4 at B 1
SHAPES = [(1, 8, 128), (1, 16, 128), (1, 32, 128), (8, 8, 128), (32, 2, 128), (1, 32, 64),
          (64, 2, 64)]
# name: merge_kernel's keyword arguments
KERNELS = {"kernel": {}, "kernel_w8": {"num_warps": 8},
           "kernel_e8k": {"elements": 8192}, "kernel_e8k_w8": {"elements": 8192, "num_warps": 8},
           "kernel_e16k_w8": {"elements": 16384, "num_warps": 8},
           "kernel_c512_e8k_w8": {"block_cols": 512, "elements": 8192, "num_warps": 8},
           "kernel_e2k": {"elements": 2048}}


def looped(merge, steps):
  @jax.jit
  def run(parts, lse, sink):
    def body(i, acc):
      out, out_lse = merge(parts, lse + i.astype(jnp.float32) * 1e-30, sink)
      return acc + out[0, 0, 0].astype(jnp.float32) + out_lse[0, 0]
    return jax.lax.fori_loop(0, steps, body, jnp.float32(0))
  return run


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--steps", type=int, default=50)
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--out", default="")
  a = ap.parse_args()
  impls = {"xla": pallas_merge.merge_partials,
           **{name: functools.partial(pallas_merge.merge_kernel, **kw)
              for name, kw in KERNELS.items()}}
  rows_out = []
  for b, s, r in SHAPES:
    rng = np.random.default_rng(0)
    parts = jnp.asarray(rng.standard_normal((b, s, r, 512), np.float32))
    lse = jnp.asarray(rng.standard_normal((b, s, r), np.float32))
    sink = jnp.asarray(rng.standard_normal((r,), np.float32))
    want = [np.asarray(x, np.float32) for x in pallas_merge.merge_partials(parts, lse, sink)]
    row = {"seqs": b, "splits": s, "rows": r, "mbytes": parts.nbytes / 1e6}
    for name, merge in impls.items():
      got = [np.asarray(x, np.float32) for x in jax.jit(merge)(parts, lse, sink)]
      err = max(float(np.abs(g - w).max()) for g, w in zip(got, want))
      run = looped(merge, a.steps)
      jax.block_until_ready(run(parts, lse, sink))
      times = [device_time.device_profile(lambda: jax.block_until_ready(run(parts, lse, sink)),
                                          a.steps)[0] for _ in range(a.rounds)]
      row[name] = statistics.median(times)
      row[name + "_err"] = err
    rows_out.append(row)
    print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                   for k, v in row.items() if not k.endswith("_err")),
          "max_err", max(v for k, v in row.items() if k.endswith("_err")), flush=True)
  if a.out:  # CSV: the performance notebook reads the results' JSON files as kv_len sweeps
    with open(a.out + ".csv", "w", newline="") as f:
      f.write(f"# {jax.devices()[0]}, jax {jax.__version__}, benchmarks/merge_bench.py: GPU busy "
              "us per merge (median of 3); *_err: max abs difference from XLA's merge\n")
      writer = csv.DictWriter(f, fieldnames=list(rows_out[0]))
      writer.writeheader()
      writer.writerows(rows_out)


if __name__ == "__main__":
  main()
