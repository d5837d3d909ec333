"""`python -m jax_mla demo`: a synthetic DeepSeek-V4 decode batch, timed and checked."""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jax_mla._src import backends
from jax_mla._src.api import decode
from jax_mla._src.layout import pack_rows


def synthetic_batch(*, batch: int, heads: int, max_len: int, tokens_per_seq: int, pool_rows: int,
                    seed: int):
  """Packed Q and KV from Gaussian rows, ragged lengths with one empty sequence, and a sink."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, max_len + 1, size=batch)
  lengths[-1] = max_len  # the longest row is always there
  if batch > 1:
    lengths[0] = 0  # an empty sequence (graph/bucket padding row)
  kv_indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
  kv_indices = rng.integers(0, pool_rows, size=int(kv_indptr[-1])).astype(np.int32)
  key = jax.random.PRNGKey(seed)
  kq, kk, ks = jax.random.split(key, 3)
  q, q_rope = pack_rows(jax.random.normal(kq, (batch * tokens_per_seq, heads, 512)) * 0.05)
  kv, kv_rope = pack_rows(jax.random.normal(kk, (pool_rows, 512)))
  sink = jax.random.normal(ks, (heads,), jnp.float32)
  return (q, q_rope, kv, kv_rope, jnp.asarray(kv_indptr), jnp.asarray(kv_indices), sink), lengths


def _median_seconds(fns, args, repeats: int) -> list[float]:
  """Median seconds per call of each function, timed in turn round by round (so other work on
  the machine weighs on all of them alike)."""
  for fn in fns:
    jax.block_until_ready(fn(*args))  # compile and warm up
  times = [[] for _ in fns]
  for _ in range(repeats):
    for fn, spent in zip(fns, times):
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      spent.append(time.perf_counter() - start)
  return [float(np.median(t)) for t in times]


def _host_plan(batch: int, heads: int) -> str:
  """What the host backend does with this batch on this CPU."""
  from jax_mla._src.aiter import planner, split  # pylint: disable=import-outside-toplevel
  flags = set()
  try:
    with open("/proc/cpuinfo") as f:
      flags = set(next((l for l in f if l.startswith("flags")), ":").split(":", 1)[1].split())
  except OSError:
    pass
  bf16 = {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"} <= flags
  kernels = ("AVX512-BF16" if bf16 and os.environ.get("JAX_MLA_HOST_KERNELS") != "fp32"
             else "fp32")
  splits = planner.host_num_kv_splits(batch, split.PADDED_HEADS.get(heads, heads))
  return (f"{splits} KV split{'s' * (splits != 1)} x {batch} sequences on "
          f"{planner.host_threads()} threads, "
          f"{kernels} kernels")


def run(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m jax_mla demo", description=__doc__)
  parser.add_argument("--batch", type=int, default=8, help="sequences (default 8)")
  parser.add_argument("--heads", type=int, default=128, help="query heads (default 128)")
  parser.add_argument("--max-len", type=int, default=512,
                      help="KV entries of the longest sequence (default 512)")
  parser.add_argument("--tokens-per-seq", type=int, default=1)
  parser.add_argument("--pool-rows", type=int, default=4096, help="rows in the KV pool")
  parser.add_argument("--backend", default="auto", choices=backends.BACKENDS)
  parser.add_argument("--repeats", type=int, default=9,
                      help="timed calls of each (median reported)")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)

  chosen, why = (backends.explain_auto() if args.backend == "auto"
                 else (args.backend, "asked for"))
  inputs, lengths = synthetic_batch(batch=args.batch, heads=args.heads, max_len=args.max_len,
                                    tokens_per_seq=args.tokens_per_seq,
                                    pool_rows=args.pool_rows, seed=args.seed)
  kwargs = dict(tokens_per_seq=args.tokens_per_seq)
  run_decode = jax.jit(lambda *a: decode(*a, backend=args.backend, **kwargs))
  run_reference = jax.jit(lambda *a: decode(*a, backend="reference", **kwargs))

  print(f"jax {jax.__version__} on {jax.default_backend()} ({jax.devices()[0]})")
  print(f"backend: {args.backend} -> {chosen} ({why})")
  if args.backend == "auto" and chosen == "reference" and jax.default_backend() == "cpu":
    print("WARNING: the C++ extension is missing, so this is not the host backend a CPU "
          "install runs; install with `pip install .` (or `tools/dev_build.sh` for a checkout)",
          file=sys.stderr)
  print(f"batch: {args.batch} sequences x {args.tokens_per_seq} token(s), {args.heads} heads, "
        f"KV lengths {lengths.tolist()}, pool of {args.pool_rows} rows, sink on")
  if chosen == "host":
    print(f"host plan: {_host_plan(args.batch, args.heads)}")
  compare = chosen != "reference"
  timed = _median_seconds([run_decode, run_reference] if compare else [run_decode], inputs,
                          args.repeats)
  seconds = timed[0]
  out, lse = run_decode(*inputs)
  ref_out, ref_lse = run_reference(*inputs)
  out = np.asarray(out.astype(jnp.float32))
  ref_out = np.asarray(ref_out.astype(jnp.float32))
  lse, ref_lse = np.asarray(lse), np.asarray(ref_lse)
  flops = 2.0 * args.heads * args.tokens_per_seq * float(lengths.sum()) * 1024
  print(f"time per call: {seconds * 1e3:.3f} ms (median of {args.repeats}), "
        f"{flops / seconds / 1e9:.2f} GFLOP/s")
  if compare:
    print(f"reference: {timed[1] * 1e3:.3f} ms per call (timed in turn with it): {chosen} is "
          f"{timed[1] / seconds:.2f}x the reference")
  print(f"out: shape {out.shape} bf16, |out| max {np.abs(out).max():.4f}; "
        f"lse: shape {lse.shape} f32")
  nonfinite = int((~np.isfinite(out)).sum() + (~np.isfinite(lse)).sum())
  both = np.isfinite(lse) & np.isfinite(ref_lse)
  print(f"vs reference: out max abs err {np.abs(out - ref_out).max():.3e}, "
        f"lse max abs err {np.abs(lse - ref_lse)[both].max():.3e}, non-finite values {nonfinite}")
  empty = np.flatnonzero(lengths == 0)
  if empty.size:
    t = empty[0] * args.tokens_per_seq
    sink_ok = bool(np.allclose(lse[t], np.asarray(inputs[-1])) and not out[t].any())
    print(f"empty sequence {empty[0]}: out == 0 and lse == sink: {sink_ok}")
  return 0 if nonfinite == 0 else 1
