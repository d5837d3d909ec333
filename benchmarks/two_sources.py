"""The cost of a second KV source: `decode(..., extra=...)` against one pool of the same total
length, on one GPU, side by side in one run.

DeepSeek-V4's layer reads top-k entries of the compressed cache and the sliding window of the
uncompressed one per step. Variants per shape (batch, heads; K = topk + window entries):
  one_pool:   one source of K entries (the baseline: what a copy into one pool would give);
  two_pools:  the top-k pool plus `extra=` the window pool (both packed fp8);
  bf16_window: the same with the window pool kept in bf16 (`kv_rope=None`), packed on the fly;
  bf16_q:     two_pools with Q given as bf16 values (`q_rope=None`), packed in the call.

Usage: PYTHONPATH=src python benchmarks/two_sources.py [--backend pallas] [--heads 64,128]
         [--batches 1,8,32,64,128] [--topk 512] [--window 128] [--steps 30] [--rounds 3]
         [--out benchmarks/results/NAME]

Timing (as benchmarks/gpu_decode.py): one jitted `fori_loop` of `--steps` calls whose indices
change every step, run under the JAX profiler; the GPU busy time per call (the union of kernel
intervals, benchmarks/timing/device_time.py), median over rounds, variants interleaved in each
round. The loop's index update is inside every variant (one_pool's concatenation fuses it; the
two-source variants update two arrays); the indptr arrays are loop inputs. `--kernels` also
profiles each variant by kernel and records the decode kernel's own ratio (kernel_two_over_one),
which leaves the loop's bookkeeping out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics

import jax
import jax.numpy as jnp

import jax_mla
from timing import call_loop, device_time

POOL = 65536


def make_problem(key, *, batch, heads, topk, window):
  k = jax.random.split(key, 6)
  q_values = (jax.random.normal(k[0], (batch, heads, 512)) * 0.05).astype(jnp.bfloat16)
  q, q_rope = jax_mla.pack_rows(q_values)
  compressed = jax_mla.pack_rows(jax.random.normal(k[1], (POOL, 512)))
  window_rows = jax.random.normal(k[2], (POOL, 512)).astype(jnp.bfloat16)
  return dict(
      q=q, q_rope=q_rope, q_values=q_values, kv=compressed[0], kv_rope=compressed[1],
      window_packed=jax_mla.pack_rows(window_rows), window_bf16=window_rows,
      topk_idx=jax.random.randint(k[3], (batch, topk), 0, POOL, jnp.int32),
      window_idx=jax.random.randint(k[4], (batch, window), 0, POOL, jnp.int32),
      sink=jax.random.normal(k[5], (heads,), jnp.float32),
      topk_indptr=indptr(batch, topk), window_indptr=indptr(batch, window),
      both_indptr=indptr(batch, topk + window))


def indptr(batch, width):
  return jnp.arange(batch + 1, dtype=jnp.int32) * width


def variant_fn(name, backend):
  """f(p, topk_idx [B, k], window_idx [B, w]) -> out. The indptr arrays are inputs (p), as a
  server's are, not recomputed in the loop."""
  def call(p, topk_idx, window_idx):
    main = (p["kv"], p["kv_rope"], p["topk_indptr"], topk_idx.reshape(-1))
    if name == "one_pool":  # the window's entries read from the same pool: one list of K
      both = jnp.concatenate([topk_idx, window_idx], axis=1)
      return jax_mla.decode(p["q"], p["q_rope"], *main[:2], p["both_indptr"],
                            both.reshape(-1), p["sink"], backend=backend)[0]
    window = (p["window_bf16"], None) if name == "bf16_window" else p["window_packed"]
    extra = jax_mla.KVSource(*window, p["window_indptr"], window_idx.reshape(-1))
    q = (p["q_values"], None) if name == "bf16_q" else (p["q"], p["q_rope"])
    return jax_mla.decode(*q, *main, p["sink"], extra=extra, backend=backend)[0]
  return call


VARIANTS = ("one_pool", "two_pools", "bf16_window", "bf16_q")


def decode_kernel_us(kernels):
  """The decode kernel's own time in a --kernels profile (the Mosaic GPU kernel, or the Triton
  kernel and merge, named jax_mla_*): the loop's index updates and XLA's merge excluded."""
  return sum(us for name, us in kernels.items()
             if "mosaic_gpu_kernel" in name or name.startswith("jax_mla_"))


def looped(f, steps):
  """steps calls of f(p, topk_idx, window_idx) in one jitted loop (timing.call_loop), both
  index lists moved on every call."""
  return call_loop.looped(
      lambda i, p: f(p, call_loop.moved(p["topk_idx"], i, POOL),
                     call_loop.moved(p["window_idx"], i, POOL)), steps)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--backend", default="pallas")
  parser.add_argument("--heads", default="64,128")
  parser.add_argument("--batches", default="1,8,32,64,128")
  parser.add_argument("--topk", type=int, default=512)
  parser.add_argument("--window", type=int, default=128)
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--out", default=None)
  parser.add_argument("--kernels", action="store_true",
                      help="also record each variant's device time per call by kernel, and the "
                           "decode kernel's own two_pools / one_pool ratio")
  args = parser.parse_args()

  rows = []
  for heads in map(int, args.heads.split(",")):
    for batch in map(int, args.batches.split(",")):
      p = make_problem(jax.random.PRNGKey(batch), batch=batch, heads=heads, topk=args.topk,
                       window=args.window)
      runs = {v: looped(variant_fn(v, args.backend), args.steps) for v in VARIANTS}
      for run in runs.values():
        jax.block_until_ready(run(p))  # compile and warm up
      times = {v: [] for v in VARIANTS}
      for _ in range(args.rounds):
        for v, run in runs.items():
          times[v].append(device_time.device_time_us(
              lambda run=run: jax.block_until_ready(run(p)), args.steps))
      med = {v: statistics.median(t) for v, t in times.items()}
      kernels = {}
      if args.kernels:  # where each variant's time goes, by kernel (one more run each)
        for v, run in runs.items():
          kernels[v] = {name: round(us, 2) for name, us in device_time.device_profile(
              lambda run=run: jax.block_until_ready(run(p)), args.steps)[1].items()}
          print(f"  {v}: {kernels[v]}")
      row = dict(heads=heads, batch=batch, topk=args.topk, window=args.window,
                 **{f"{v}_us": round(med[v], 2) for v in VARIANTS},
                 two_over_one=round(med["two_pools"] / med["one_pool"], 4),
                 bf16_over_one=round(med["bf16_window"] / med["one_pool"], 4),
                 bf16_q_over_one=round(med["bf16_q"] / med["one_pool"], 4),
                 **({"kernels_us": kernels,
                     "kernel_two_over_one": round(decode_kernel_us(kernels["two_pools"])
                                                  / decode_kernel_us(kernels["one_pool"]), 4)}
                    if kernels else {}))
      rows.append(row)
      print(f"H {heads:3d} B {batch:3d}  one pool {med['one_pool']:8.1f} us  two pools "
            f"{med['two_pools']:8.1f} us ({row['two_over_one']:.3f}x)  bf16 window "
            f"{med['bf16_window']:8.1f} us ({row['bf16_over_one']:.3f}x)  bf16 Q "
            f"{med['bf16_q']:8.1f} us ({row['bf16_q_over_one']:.3f}x)"
            + (f"  kernel alone {row['kernel_two_over_one']:.3f}x" if kernels else ""), flush=True)
  meta = dict(date=datetime.date.today().isoformat(), device=str(jax.devices()[0].device_kind),
              jax=jax.__version__, backend=args.backend, steps=args.steps, rounds=args.rounds,
              method="GPU busy time per call (profiler), median over rounds, variants "
                     "interleaved; indices change every step; pool 65536 rows")
  if args.out:
    with open(args.out + ".json", "w") as f:
      json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
  main()
