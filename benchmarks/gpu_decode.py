"""The decode on one GPU: the Pallas backend, the XLA reference, a plain jitted XLA version, and
the GPU's ceilings, over DeepSeek-V4 shapes (issue 8).

Usage: python benchmarks/gpu_decode.py
         [--suite full|h128|others|h64|h16x4|quick|others-quick|big|floor|batch1|tiny]
         [--impls pallas,plain,reference] [--configs 64x64w8s2,...] [--steps 30] [--rounds 3]
         [--out benchmarks/results/NAME]

Implementations: pallas (the Triton-lowered kernel; --configs for its variants), plain,
reference, and mosaic (the Mosaic GPU kernel, what backend="pallas" runs on Hopper).

Cost on the H200 (2026-12-02): about 3 s per (shape, implementation), mostly compilation, so
`--suite h128` with the default impls takes about 4 minutes and `--suite others` about 5; run
them as two commands (`full` does not fit one 10-minute device command). With --timing profiler
and three implementations (2026-12-03) h128 took 227 s, h64 about 230 and h16x4 271.

Timing: each measurement is one jitted `lax.fori_loop` of `--steps` decode calls whose KV
indices change every step (timing/call_loop.py: `(indices + step * 4099) & 65535`, a
permutation of the pool, so no call is loop-invariant; each call's output the loop's carry),
timed with a host clock around `block_until_ready`, divided by the steps. The loop step's own
cost (the index update and the loop) is measured alone ("idx upd" column: 13-25 us per step on
the H200 by the host clock) and NOT subtracted: small shapes are dominated by it, for every
implementation alike. Implementations are interleaved within each round; the result is the
median over rounds. With `--timing profiler` each round instead runs the loop once under the
JAX profiler and takes the time in which the GPU's streams ran anything, per step
(benchmarks/timing/device_time.py): the gaps between the loop's iterations drop out, its index
update stays (until 2026-12-04 with a kept output element: about 1.7 us per step on the H200
together, against 13-25 us of host-clock gaps). Its rounds agreed within 1% on the H200
(2026-12-03). `--kernels` adds each implementation's device time per call by kernel name.

Counted work: FLOPs = 2 * T * H * K * (512 + 512); bytes that must move = q rows (512 + 128) +
gathered KV rows (512 + 128 each, per sequence) + out (bf16). The pool of 65536 rows (40 MiB)
fits in the 60 MB L2, as in the issue's FlashMLA measurement.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import datetime
import json
import math
import os
import platform as pyplatform
import statistics
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_mla
from jax_mla._src import layout
from jax_mla._src.pallas import triton as pd
from timing import call_loop, device_time

POOL = 65536
INTERPRET = False
# FlashMLA sm90 MODEL1 fp8 sparse decode and a plain jitted XLA version on this H200 (issue 8),
# 128 heads, one token per row: {(batch, K): (FlashMLA us, plain XLA us)}.
ISSUE_TABLE = {
    (1, 512): (16.1, 23.5), (1, 1024): (18.2, 22.1), (1, 2048): (22.0, 29.9),
    (8, 512): (19.1, 33.5), (8, 1024): (22.9, 41.8), (8, 2048): (29.7, 64.7),
    (32, 512): (34.1, 66.5), (32, 1024): (45.8, 106.0), (32, 2048): (61.4, 193.5),
    (64, 512): (32.7, 112.2), (64, 1024): (51.9, 198.5), (64, 2048): (90.2, 365.1),
    (128, 512): (58.1, 211.2), (128, 1024): (96.5, 376.8), (128, 2048): (171.9, 691.6),
}


def plain_xla_decode(q, q_rope, kv, kv_rope, indices, sink, *, tokens_per_seq):
  """The plain jitted XLA baseline: gather, dequantize, einsum, softmax with sink.

  indices: int32 [B, K] (every sequence has K entries). Returns (out bf16 [T, H, 512], lse).
  """
  num_tokens, num_heads = q.shape[:2]
  num_seqs = indices.shape[0]
  queries = layout.unpack_rows(q, q_rope, jnp.bfloat16).reshape(
      num_seqs, tokens_per_seq * num_heads, layout.HEAD_DIM)
  keys = layout.unpack_rows(kv[indices], kv_rope[indices], jnp.bfloat16)  # [B, K, 512]
  scores = jnp.einsum("bmd,bkd->bmk", queries, keys, preferred_element_type=jnp.float32)
  scores = scores / math.sqrt(layout.HEAD_DIM)
  sink_rows = jnp.tile(sink, tokens_per_seq)[None, :]
  m = jnp.maximum(jnp.max(scores, axis=-1), sink_rows)
  p = jnp.exp(scores - m[..., None])
  denom = jnp.sum(p, axis=-1) + jnp.exp(sink_rows - m)
  out = jnp.einsum("bmk,bkd->bmd", p.astype(jnp.bfloat16), keys,
                   preferred_element_type=jnp.float32) / denom[..., None]
  lse = m + jnp.log(denom)
  return (out.astype(jnp.bfloat16).reshape(num_tokens, num_heads, layout.HEAD_DIM),
          lse.reshape(num_tokens, num_heads))


def parse_config(text: str) -> pd.KernelConfig:
  """'64x64w8s2[-msN]' -> block_rows 64, block_kv 64, num_warps 8, num_stages 2,
  min_split_entries N (default 256)."""
  base, *flags = text.split("-")
  rows, rest = base.split("x")
  kv, rest = rest.split("w")
  warps, stages = rest.split("s")
  return pd.KernelConfig(int(rows), int(kv), int(warps), int(stages),
                         min_split_entries=next((int(f[2:]) for f in flags if f.startswith("ms")),
                                                256))


def make_problem(key, *, batch, heads, tokens_per_seq, kv_len):
  k1, k2, k3, k4 = jax.random.split(key, 4)
  tokens = batch * tokens_per_seq
  # Scales that give O(1) scores: the softmax is neither uniform nor one-hot.
  q, q_rope = jax_mla.pack_rows(jax.random.normal(k1, (tokens, heads, 512)) * 0.05)
  kv, kv_rope = jax_mla.pack_rows(jax.random.normal(k2, (POOL, 512)))
  indices = jax.random.randint(k3, (batch, kv_len), 0, POOL, jnp.int32)
  sink = jax.random.normal(k4, (heads,), jnp.float32)
  indptr = jnp.arange(batch + 1, dtype=jnp.int32) * kv_len
  return dict(q=q, q_rope=q_rope, kv=kv, kv_rope=kv_rope, indices=indices, indptr=indptr,
              sink=sink)


def decode_fn(impl, *, tokens_per_seq, config=None):
  """f(p, indices [B, K]) -> out, for one implementation."""
  if impl == "plain":
    return lambda p, idx: plain_xla_decode(p["q"], p["q_rope"], p["kv"], p["kv_rope"], idx,
                                           p["sink"], tokens_per_seq=tokens_per_seq)[0]
  if impl == "reference":
    return lambda p, idx: jax_mla.decode(p["q"], p["q_rope"], p["kv"], p["kv_rope"], p["indptr"],
                                         idx.reshape(-1), p["sink"], tokens_per_seq=tokens_per_seq,
                                         backend="reference")[0]
  if impl == "pallas":
    return lambda p, idx: pd.pallas_decode(p["q"], p["q_rope"], p["kv"], p["kv_rope"],
                                           p["indptr"], idx.reshape(-1), p["sink"],
                                           tokens_per_seq=tokens_per_seq, config=config,
                                           interpret=INTERPRET)[0]
  if impl in MOSAIC_IMPLS:
    from jax_mla._src.pallas.mosaic import decode as md  # pylint: disable=import-outside-toplevel
    return lambda p, idx: md.mosaic_decode(p["q"], p["q_rope"], p["kv"], p["kv_rope"],
                                           p["indptr"], idx.reshape(-1), p["sink"],
                                           tokens_per_seq=tokens_per_seq)[0]
  if impl == "index_update":
    return lambda p, idx: idx
  raise ValueError(impl)


# The Mosaic GPU kernel, by implementation name (its alternatives that lost, with their figures:
# benchmarks/README.md; their code: the history).
MOSAIC_IMPLS = ("mosaic",)


def looped(f, steps):
  """steps calls of f(p, indices) in one jitted loop (timing.call_loop), the indices moved on
  every call."""
  return call_loop.looped(lambda i, p: f(p, call_loop.moved(p["indices"], i, POOL)), steps)


def time_once(run, p, steps):
  t0 = time.perf_counter()
  jax.block_until_ready(run(p))
  return (time.perf_counter() - t0) / steps * 1e6


def ceilings(rounds=3, iters=10):
  """A large bf16 matmul (TFLOP/s) and a device copy (TB/s, bytes read + written), each as a
  loop of `iters` dependent operations inside one jitted call."""
  n = 8192
  a = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.bfloat16)
  b = jax.random.normal(jax.random.PRNGKey(2), (n, n), jnp.bfloat16) * (1 / math.sqrt(n))
  mm = jax.jit(lambda a, b: jax.lax.fori_loop(0, iters, lambda i, c: c @ b, a))
  x = jax.random.randint(jax.random.PRNGKey(3), (2**28,), 0, 1000, jnp.int32)  # 1 GiB
  cp = jax.jit(lambda x: jax.lax.fori_loop(0, iters, lambda i, y: y + 1, x))
  jax.block_until_ready(mm(a, b)); jax.block_until_ready(cp(x))
  mm_t, cp_t = [], []
  for _ in range(rounds):
    t0 = time.perf_counter(); jax.block_until_ready(mm(a, b)); mm_t.append(time.perf_counter() - t0)
    t0 = time.perf_counter(); jax.block_until_ready(cp(x)); cp_t.append(time.perf_counter() - t0)
  return {"matmul_tflops": iters * 2 * n**3 / statistics.median(mm_t) / 1e12,
          "copy_tbps": iters * 2 * x.nbytes / statistics.median(cp_t) / 1e12}


def shapes_for(suite):
  batches, lens = (1, 8, 32, 64, 128), (512, 1024, 2048)
  if suite == "tiny":  # a CPU smoke test of this script (with --interpret)
    return [(16, 4, 2, 64)]
  if suite == "big":
    return [(128, 1, b, 2048) for b in (64, 128)]
  if suite == "quick":
    return [(128, 1, b, k) for b in (1, 64, 128) for k in (512, 2048)]
  if suite == "floor":  # the issue's landing floor at 128 heads: batch 1 and batch >= 64
    return [(128, 1, b, k) for b in (1, 64, 128) for k in lens]
  if suite == "batch1":  # where launches and the loop's own step dominate
    return [(128, 1, 1, 512), (128, 1, 1, 2048), (64, 1, 1, 2048), (16, 4, 1, 2048)]
  if suite == "others-quick":
    return [(h, t, b, k) for h, t in ((64, 1), (16, 4)) for b in (1, 64, 128) for k in (512, 2048)]
  h128 = [(128, 1, b, k) for b in batches for k in lens]
  others = [(64, 1, b, k) for b in batches for k in lens] + [
      (16, 4, b, k) for b in batches for k in lens]
  return {"h128": h128, "others": others, "full": h128 + others, "h64": others[:15],
          "h16x4": others[15:]}[suite]


def check_agreement(p, tokens_per_seq, config, impl="pallas"):
  """max |impl - plain| / max |plain| on one problem: a guard, not the accuracy test."""
  idx = p["indices"]
  a = decode_fn(impl, tokens_per_seq=tokens_per_seq, config=config)(p, idx)
  b = decode_fn("plain", tokens_per_seq=tokens_per_seq)(p, idx)
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)), bool(np.isfinite(a).all())


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--suite", default="full",
                  choices=["full", "h128", "others", "h64", "h16x4", "quick", "others-quick", "big", "floor",
                           "batch1", "tiny"])
  ap.add_argument("--impls", default="pallas,plain,reference")
  ap.add_argument("--configs", default="", help="Pallas variants, e.g. 64x64w8s2,128x32w16s2")
  ap.add_argument("--steps", type=int, default=30)
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--reference-max-batch", type=int, default=128)
  ap.add_argument("--out", default="")
  ap.add_argument("--interpret", action="store_true", help="Pallas interpret mode (CPU smoke)")
  ap.add_argument("--no-ceilings", action="store_true",
                  help="skip measuring the matmul and copy ceilings (HBM frac then needs --copy-tbps)")
  ap.add_argument("--copy-tbps", type=float, default=float("nan"),
                  help="with --no-ceilings: the device copy rate to take the HBM fraction against "
                       "(the H200 did 4.24 TB/s on 2026-12-02); unset, the column shows '-'")
  ap.add_argument("--compile-workers", type=int, default=1)
  ap.add_argument("--timing", choices=["clock", "profiler"], default="clock",
                  help="host clock around the loop, or the GPU's busy time in a profiler trace")
  ap.add_argument("--kernels", action="store_true",
                  help="with --timing profiler: print and record each implementation's device "
                       "time per call by kernel (its last round)")
  a = ap.parse_args()
  if a.kernels and a.timing != "profiler":
    ap.error("--kernels needs --timing profiler")

  dev = jax.devices()[0]
  meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "device": getattr(dev, "device_kind", str(dev)), "jax": jax.__version__,
          "python": pyplatform.python_version(), "steps": a.steps, "rounds": a.rounds}
  try:
    meta["driver"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=20).stdout.strip()
  except Exception:  # pylint: disable=broad-except
    pass
  global INTERPRET  # pylint: disable=global-statement
  INTERPRET = a.interpret
  # (Until 2026-12-03 --no-ceilings set copy_tbps to 1.0, so those runs' "HBM frac" columns
  # and hbm_fraction fields are TB/s, not fractions.)
  ceil = ({"matmul_tflops": float("nan"), "copy_tbps": a.copy_tbps} if a.no_ceilings
          else ceilings())
  meta.update(ceil, timing=a.timing)
  print(json.dumps(meta), flush=True)

  impls = a.impls.split(",")
  variants = [("pallas:" + c, parse_config(c)) for c in a.configs.split(",") if c]
  rows = []
  # Build every (shape, implementation), then compile them all in parallel (XLA and Triton
  # compilation release the GIL), then time shape by shape.
  plans = []
  for heads, tps, batch, kv_len in shapes_for(a.suite):
    p = make_problem(jax.random.PRNGKey(batch * 7 + kv_len), batch=batch, heads=heads,
                     tokens_per_seq=tps, kv_len=kv_len)
    runs = {}
    for impl in impls:
      if impl == "pallas" and variants:
        for name, cfg in variants:
          runs[name] = looped(decode_fn("pallas", tokens_per_seq=tps, config=cfg), a.steps)
      elif impl == "reference" and batch > a.reference_max_batch:
        continue
      else:
        runs[impl] = looped(decode_fn(impl, tokens_per_seq=tps), a.steps)
    runs["index_update"] = looped(decode_fn("index_update", tokens_per_seq=tps), a.steps)
    plans.append(((heads, tps, batch, kv_len), p, runs))

  def compile_one(job):
    run, p = job
    try:
      return run.lower(p).compile()
    except Exception as e:  # pylint: disable=broad-except
      return f"{type(e).__name__}: {str(e)[:300]}"
  jobs = [(run, p) for _, p, runs in plans for run in runs.values()]
  t0 = time.perf_counter()
  if a.compile_workers > 1:  # XLA serialized these on the H200: no faster there (2026-12-02)
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.compile_workers) as pool:
      compiled = iter(list(pool.map(compile_one, jobs)))
  else:
    compiled = iter([compile_one(job) for job in jobs])
  print(f"compiled {len(jobs)} executables in {time.perf_counter() - t0:.0f} s", flush=True)

  for (heads, tps, batch, kv_len), p, runs in plans:
    failed = {}
    for name in list(runs):
      exe = next(compiled)
      if isinstance(exe, str):
        failed[name] = exe
        del runs[name]
        print(f"  {name} failed: {exe}", flush=True)
        continue
      try:
        jax.block_until_ready(exe(p))  # warm up
        runs[name] = exe
      except Exception as e:  # pylint: disable=broad-except
        failed[name] = f"{type(e).__name__}: {str(e)[:300]}"
        del runs[name]
        print(f"  {name} failed: {failed[name]}", flush=True)
    times = {name: [] for name in runs}
    kernels = {}
    for _ in range(a.rounds):
      for name, run in runs.items():
        if a.timing == "profiler":
          busy, kernels[name] = device_time.device_profile(
              lambda run=run: jax.block_until_ready(run(p)), a.steps)
          times[name].append(busy)
        else:
          times[name].append(time_once(run, p, a.steps))
    agree = {}
    if "pallas" in impls and "plain" in impls:
      for name, cfg in (variants or [("pallas", None)]):
        if name in runs:
          agree[name] = check_agreement(p, tps, cfg)
    for name in MOSAIC_IMPLS:
      if name in runs and "plain" in impls:
        agree[name] = check_agreement(p, tps, None, impl=name)
    tokens = batch * tps
    flops = 2.0 * tokens * heads * kv_len * 1024
    nbytes = tokens * heads * (640 + 1024) + batch * kv_len * 640
    issue = ISSUE_TABLE.get((batch, kv_len)) if (heads, tps) == (128, 1) else None
    for name, ts in times.items():
      us = statistics.median(ts)
      rows.append({
          "heads": heads, "tokens_per_seq": tps, "batch": batch, "kv_len": kv_len,
          "impl": name, "us": us, "us_min": min(ts), "us_max": max(ts),
          "tflops": flops / us / 1e6, "hbm_fraction": nbytes / (us * 1e-6) / (ceil["copy_tbps"] * 1e12),
          "flashmla_us": issue[0] if issue else None, "issue_plain_us": issue[1] if issue else None,
          "rel_err_vs_plain": agree[name][0] if name in agree else None,
          "finite": agree[name][1] if name in agree else None,
          **({"us_by_kernel": kernels[name]} if a.kernels else {})})
    for name, why in failed.items():
      rows.append({"heads": heads, "tokens_per_seq": tps, "batch": batch, "kv_len": kv_len,
                   "impl": name, "error": why})
    by = {r["impl"]: r["us"] for r in rows[-len(times) - len(failed):] if "us" in r}
    line = " ".join(f"{k}={v:.1f}" for k, v in by.items())
    worst = max((e for e, _ in agree.values()), default=None)
    finite = all(f for _, f in agree.values())
    print(f"H={heads} tps={tps} B={batch} K={kv_len}: {line} worst_rel_err={worst} "
          f"finite={finite}", flush=True)
    if a.kernels:
      for name, per_kernel in kernels.items():
        top = sorted(per_kernel.items(), key=lambda kv: -kv[1])
        print(f"  {name} kernels (us per call): "
              + ", ".join(f"{k[:48]}={v:.2f}" for k, v in top[:10]), flush=True)
    if a.out:
      write_results(a.out, meta, rows)

  print_table(rows, impls, variants)
  if a.out:  # written after every shape above
    print(f"wrote {a.out}.json and .csv")


def write_results(out, meta, rows):
  """The rows so far as JSON and CSV (rewritten after every shape: a run cut short by a device
  time limit keeps what it measured)."""
  os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
  with open(out + ".json", "w") as f:
    json.dump({"meta": meta, "rows": rows}, f, indent=1)
  # The per-kernel breakdown (--kernels) is a mapping: JSON only.
  keys = sorted({k for r in rows for k in r} - {"us_by_kernel"},
                key=lambda k: list(rows[0]).index(k) if k in rows[0] else 99)
  with open(out + ".csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)


def print_table(rows, impls, variants):
  shapes = sorted({(r["heads"], r["tokens_per_seq"], r["batch"], r["kv_len"]) for r in rows},
                  key=lambda s: (-s[0], s[1], s[3], s[2]))
  pallas_names = [n for n, _ in variants] or (["pallas"] if "pallas" in impls else [])
  pallas_names += [n for n in MOSAIC_IMPLS if n in impls]
  print()
  print("| H | tps | B | K | " + " | ".join(f"{n} us" for n in pallas_names) +
        " | TFLOP/s | HBM frac | plain us | ref us | x plain | x ref | FlashMLA us | idx upd us |")
  print("|" + "---|" * (12 + len(pallas_names)))
  for s in shapes:
    got = {r["impl"]: r for r in rows if (r["heads"], r["tokens_per_seq"], r["batch"],
                                          r["kv_len"]) == s and "us" in r}
    best = min((got[n] for n in pallas_names if n in got), key=lambda r: r["us"], default=None)
    def us(name):
      return f"{got[name]['us']:.1f}" if name in got else "-"
    def ratio(name):
      return f"{got[name]['us'] / best['us']:.2f}" if (best and name in got) else "-"
    fm = next((r["flashmla_us"] for r in got.values() if r.get("flashmla_us")), None)
    hbm = "-" if not best or math.isnan(best["hbm_fraction"]) else f"{best['hbm_fraction']:.2f}"
    rate = f"{best['tflops']:.0f} | {hbm}" if best else "- | -"
    print(f"| {s[0]} | {s[1]} | {s[2]} | {s[3]} | " +
          "".join(f"{us(n)} | " for n in pallas_names) + f"{rate} | " +
          f"{us('plain')} | {us('reference')} | {ratio('plain')} | {ratio('reference')} | "
          f"{fm if fm else '-'} | {us('index_update')} |")


if __name__ == "__main__":
  main()
