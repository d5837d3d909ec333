"""The CPU sweep: the host backend against the reference, side by side, at DeepSeek-V4 shapes.

Usage: python benchmarks/cpu_decode.py [--batch 1 2 4 8 16 32 64] [--len 512 2048 8192]
                                       [--rounds 5] [--min-seconds 3] [--impls ...]
                                       [--evict-mib 64] [--out PATH_STEM]
       python benchmarks/cpu_decode.py --table RESULTS.json   (the README's table)

Shapes: 128 heads, one token per sequence; every batch x KV length with all sequences that long
(random pool rows of a 65,536-row pool), plus the demo's own batch (`jax-mla demo` defaults: 8
sequences, ragged lengths up to 512 with an empty one, a sink). Implementations, each one jitted
function timed on the host clock, all of a shape interleaved round by round
(`timing.host_clock.interleaved`) so that other work on the machine spreads over all of them,
each call after 64 MiB written (--evict-mib) so that every implementation starts with nothing
cached (without it, the one timed right after another that read the same pool rows found them
cached: 0.1-0.3 ms of a 2 ms call); the median over rounds (at least --rounds, more until a shape's rounds take --min-seconds,
up to 60) is reported with its min and max, and `ratio` is the reference's median
over the row's:

  reference       backend="reference" (pure JAX, chunked online softmax; XLA's dot)
  host            backend="host", num_kv_splits=None: what backend="auto" runs on a CPU
  host-fp32       the same with the fp32 kernels (JAX_MLA_HOST_KERNELS=fp32): what a CPU without
                  AVX512-BF16 runs
  host-persistent decode_persistent on the host backend, make_workspace() defaults (P = 128)
  host-kernel     the host executor alone (the split primitive at the host plan, merging its
                  splits itself): what the XLA around it costs is host minus this
  host-xla-merge  the host executor ending as the gfx950 path does: its partials merged in XLA
                  (merge_in_executor=False; at least 2 splits for the LSE)
  xla-dot-f32     only the arithmetic, by XLA: QK and PV as jnp.einsum over K already gathered
                  and dequantized to f32 [B, K, 512] (no gather, no dequantization, no merge):
                  what XLA's own dot does with the inner products. Shapes up to 2^17 entries.
  xla-dot-bf16    the same with bf16 Q, K and P, f32 accumulation (preferred_element_type).

GFLOP/s count 2 * B * 128 * K * 1024 (QK and PV, 512 dims each) over the median. Memory:
`temp_mib` is XLA's temporary allocation of the compiled call (the host path's partials and
merge included); `host_scratch_mib` the host executor's own per-thread buffers (threads x one
QueryBlock); `peak_rss_mib` in meta the process's peak resident memory over the whole sweep (pool
and inputs included). meta records the machine, its load average before and after, and which
host kernels ran.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import resource
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_mla
from jax_mla._src.aiter import planner, split
from jax_mla._src.cli.demo import synthetic_batch
from timing.host_clock import CacheEvictor, interleaved

HEADS = 128
POOL = 65536
IMPLS = ("reference", "host", "host-fp32", "host-persistent", "host-kernel", "host-xla-merge",
         "xla-dot-f32", "xla-dot-bf16")
XLA_DOT_MAX_ENTRIES = 1 << 17  # [B, K, 512] f32 beyond this is over 256 MiB
SCALE = 1.0 / np.sqrt(512.0)
# One QueryBlock per thread (csrc/host/attention_tile.cc): accumulator and Q 256 KiB each, the
# tile (up to 112 rows of 2 KiB), its scores and weight pairs.
QUERY_BLOCK_MIB = (2 * 128 * 512 * 4 + 112 * 512 * 4 + 112 * 128 * 4 + 56 * 128 * 4) / 2**20


def uniform_batch(batch: int, kv_len: int, seed: int = 0):
  key = jax.random.PRNGKey(seed)
  kq, kk, ki, ks = jax.random.split(key, 4)
  q, q_rope = jax_mla.pack_rows(jax.random.normal(kq, (batch, HEADS, 512)) * 0.05)
  kv, kv_rope = jax_mla.pack_rows(jax.random.normal(kk, (POOL, 512)))
  kv_indptr = jnp.arange(batch + 1, dtype=jnp.int32) * kv_len
  kv_indices = jax.random.randint(ki, (batch * kv_len,), 0, POOL, jnp.int32)
  sink = jax.random.normal(ks, (HEADS,), jnp.float32)
  return (q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink), np.full(batch, kv_len)


class HostKernels:
  """Runs a call with JAX_MLA_HOST_KERNELS set (the executor reads it at each call)."""

  def __init__(self, fn, value):
    self.fn, self.value = fn, value

  def __call__(self, *args):
    old = os.environ.get("JAX_MLA_HOST_KERNELS")
    os.environ["JAX_MLA_HOST_KERNELS"] = self.value
    try:
      return jax.block_until_ready(self.fn(*args))
    finally:
      if old is None:
        del os.environ["JAX_MLA_HOST_KERNELS"]
      else:
        os.environ["JAX_MLA_HOST_KERNELS"] = old


def dense_inputs(args, lengths, dtype):
  """Q [B, H, 512] and the sequences' K [B, K, 512] (uniform lengths), dequantized."""
  q, q_rope, kv, kv_rope, kv_indptr, kv_indices, _ = args
  b, k = len(lengths), int(lengths[0])
  queries = jax_mla.unpack_rows(q, q_rope).astype(dtype)
  rows = kv_indices.reshape(b, k)
  keys = jax_mla.unpack_rows(kv[rows], kv_rope[rows]).astype(dtype)
  return queries, keys


def xla_dot(queries, keys):
  """Attention over dense K, the arithmetic only: two einsums and a softmax with XLA."""
  f32 = jnp.float32
  s = jnp.einsum("bhd,bkd->bhk", queries, keys, preferred_element_type=f32,
                 precision=jax.lax.Precision.HIGHEST) * f32(SCALE)
  p = jax.nn.softmax(s, axis=-1).astype(keys.dtype)
  return jnp.einsum("bhk,bkd->bhd", p, keys, preferred_element_type=f32,
                    precision=jax.lax.Precision.HIGHEST)


def host_kernel(*args):
  """The split primitive at the host plan, merged in the executor: its results."""
  q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink = args
  num_seqs = kv_indptr.shape[0] - 1
  splits = planner.host_num_kv_splits(num_seqs, q.shape[1])
  seq = jnp.arange(num_seqs + 1, dtype=jnp.int32)
  return split.split_decode_p.bind(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, seq,
                                   seq * splits, num_kv_splits=splits, tokens_per_seq=1,
                                   backend="host", fill_unwritten_nan=True,
                                   merge_in_executor=True)


def make_calls(args, lengths, impls):
  """name -> (zero-argument call, temp MiB)."""
  uniform = len(set(lengths.tolist())) == 1
  calls = {}

  def add(name, fn, *fn_args):
    jitted = jax.jit(fn)
    mem = jitted.lower(*fn_args).compile().memory_analysis()
    temp = mem.temp_size_in_bytes / 2**20 if mem is not None else float("nan")
    call = (lambda: jitted(*fn_args))
    calls[name] = (call, temp)

  for impl in impls:
    if impl == "reference":
      add(impl, lambda *a: jax_mla.decode(*a, backend="reference"), *args)
    elif impl in ("host", "host-fp32"):
      fn = jax.jit(lambda *a: jax_mla.decode(*a, backend="host"))
      mem = fn.lower(*args).compile().memory_analysis()
      wrapped = HostKernels(fn, "fp32" if impl == "host-fp32" else "auto")
      calls[impl] = ((lambda w=wrapped: w(*args)), mem.temp_size_in_bytes / 2**20)
    elif impl == "host-persistent":
      step = jax.jit(lambda ws, *a: jax_mla.decode_persistent(*a, ws, backend="host"),
                     donate_argnums=0)
      state = {"ws": jax_mla.make_workspace(max_rows=max(len(lengths), 1))}
      mem = step.lower(state["ws"], *args).compile().memory_analysis()

      def persistent_call(state=state, step=step):
        out, lse, state["ws"] = step(state["ws"], *args)
        return out, lse
      calls[impl] = (persistent_call, mem.temp_size_in_bytes / 2**20)
    elif impl == "host-kernel":
      add(impl, host_kernel, *args)
    elif impl == "host-xla-merge":
      add(impl, lambda *a: split.split_decode(*a, tokens_per_seq=1, num_kv_splits=None,
                                              backend="host", merge_in_executor=False), *args)
    elif impl in ("xla-dot-f32", "xla-dot-bf16"):
      if not uniform or len(lengths) * int(lengths[0]) > XLA_DOT_MAX_ENTRIES:
        continue
      dtype = jnp.float32 if impl == "xla-dot-f32" else jnp.bfloat16
      add(impl, xla_dot, *dense_inputs(args, lengths, dtype))
    else:
      raise ValueError(f"unknown impl {impl!r}; known: {IMPLS}")
  return calls


def rounds_for(calls, rounds, min_seconds, max_rounds=60):
  """At least `rounds`, and enough for the shape's rounds to take `min_seconds` (up to
  `max_rounds`): a millisecond call on a shared 2-core machine needs many samples for a
  stable median."""
  probe = interleaved(calls, 1)
  per_round = sum(t[0] for t in probe.values())
  return max(rounds, min(max_rounds, int(np.ceil(min_seconds / max(per_round, 1e-6)))))


def measure(label, args, lengths, impls, rounds, min_seconds=0.0, evict=None):
  calls = make_calls(args, lengths, impls)
  plain = {name: c for name, (c, _) in calls.items()}
  rounds = rounds_for(plain, rounds, min_seconds)
  times = interleaved(plain, rounds, warmup=0, before_each=evict)
  flops = 2.0 * HEADS * float(lengths.sum()) * 1024
  ref = float(np.median(times["reference"])) if "reference" in times else None
  threads = planner.host_threads()
  rows = []
  for name, (_, temp) in calls.items():
    med = float(np.median(times[name]))
    row = {"heads": HEADS, "tokens_per_seq": 1, "batch": len(lengths),
           "kv_len": int(lengths.max()), "shape": label, "impl": name, "us": med * 1e6,
           "us_min": float(np.min(times[name])) * 1e6, "us_max": float(np.max(times[name])) * 1e6,
           "gflops": flops / med / 1e9, "ratio": (ref / med) if ref else None,
           "temp_mib": temp, "rounds": rounds}
    if name.startswith("host"):
      row["host_scratch_mib"] = threads * QUERY_BLOCK_MIB
      if name != "host-persistent":
        row["num_kv_splits"] = planner.host_num_kv_splits(len(lengths), HEADS)
        if name == "host-xla-merge":  # the LSE from XLA's merge
          row["num_kv_splits"] = split.splits_for_lse(row["num_kv_splits"])
    rows.append(row)
    ratio = f", {row['ratio']:.2f}x the reference" if ref and name != "reference" else ""
    print(f"{label:>12} B={len(lengths):<3} K={int(lengths.max()):<5} {name:>16}: "
          f"{med * 1e3:9.2f} ms [{row['us_min'] / 1e3:.2f}, {row['us_max'] / 1e3:.2f}] "
          f"{row['gflops']:6.1f} GFLOP/s, temp {temp:.1f} MiB{ratio}", flush=True)
  return rows


def cpu_meta():
  model, flags, l2 = platform.processor() or platform.machine(), [], None
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name") and model in ("", platform.machine()):
          model = line.split(":", 1)[1].strip()
        if line.startswith("flags") and not flags:
          flags = line.split(":", 1)[1].split()
    with open("/sys/devices/system/cpu/cpu0/cache/index2/size") as f:
      l2 = f.read().strip()
  except OSError:
    pass
  isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16") if f in flags]
  return {"cpu": model, "threads": planner.host_threads(), "isa": isa, "l2_per_core": l2}


def host_kernels():
  """Which kernels backend='host' runs here (the C++ core's pick)."""
  ext_flags = cpu_meta()["isa"]
  forced = os.environ.get("JAX_MLA_HOST_KERNELS")
  if forced == "fp32" or "avx512_bf16" not in ext_flags:
    return "fp32"
  return "avx512-bf16"


def write(stem, rows, meta):
  os.makedirs(os.path.dirname(os.path.abspath(stem)), exist_ok=True)
  with open(stem + ".json", "w") as f:
    json.dump({"meta": meta, "rows": rows}, f, indent=1)
    f.write("\n")
  keys = ["shape", "heads", "batch", "kv_len", "impl", "us", "us_min", "us_max", "gflops",
          "ratio", "temp_mib", "host_scratch_mib", "num_kv_splits", "rounds"]
  with open(stem + ".csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)


def table(path, impl="host"):
  """The README's table from a results file: impl's ratio to the reference (and its ms) per
  K x batch, and the demo's row."""
  with open(path) as f:
    rows = json.load(f)["rows"]
  cell = {(r["shape"], r["batch"], r["kv_len"]): r for r in rows if r["impl"] == impl}
  batches = sorted({b for s, b, _ in cell if s == "uniform"})
  lines = ["| K \\ batch | " + " | ".join(str(b) for b in batches) + " |",
           "|---|" + "---|" * len(batches)]
  for kv_len in sorted({k for s, _, k in cell if s == "uniform"}):
    entries = [cell.get(("uniform", b, kv_len)) for b in batches]
    lines.append(f"| {kv_len} | " + " | ".join(
        f"{e['ratio']:.2f}x ({e['us'] / 1e3:.3g} ms)" if e else "" for e in entries) + " |")
  demo = cell.get(("demo", 8, 512))
  if demo:
    lines.append(f"\ndemo batch: {demo['ratio']:.2f}x ({demo['us'] / 1e3:.3g} ms)")
  return "\n".join(lines)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
  p.add_argument("--len", type=int, nargs="+", default=[512, 2048, 8192])
  p.add_argument("--rounds", type=int, default=5, help="at least this many rounds per shape")
  p.add_argument("--min-seconds", type=float, default=3.0,
                 help="more rounds (up to 60) until a shape's rounds take this long")
  p.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
  p.add_argument("--no-demo", action="store_true", help="skip the demo's shape")
  p.add_argument("--out", metavar="STEM", help="write STEM.json and STEM.csv")
  p.add_argument("--table", metavar="JSON", help="print the README's table of a results file")
  p.add_argument("--evict-mib", type=int, default=64,
                 help="MiB written before every timed call, so that each starts with nothing "
                      "cached (0: off; default 64)")
  a = p.parse_args(argv)
  if a.table:
    print(table(a.table))
    return None
  load_before = os.getloadavg()
  evict = CacheEvictor(a.evict_mib) if a.evict_mib > 0 else None
  rows = []
  if not a.no_demo:
    args, lengths = synthetic_batch(batch=8, heads=HEADS, max_len=512, tokens_per_seq=1,
                                    pool_rows=4096, seed=0)
    rows += measure("demo", args, lengths, a.impls, a.rounds, a.min_seconds, evict)
  for kv_len in a.len:
    for batch in a.batch:
      args, lengths = uniform_batch(batch, kv_len)
      rows += measure("uniform", args, lengths, a.impls, a.rounds, a.min_seconds, evict)
  machine = cpu_meta()
  meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          # "CPU ..." is how notebooks/performance.md tells CPU files from GPU ones.
          "device": f"CPU ({machine['cpu']}, {machine['threads']} threads; "
                    f"{', '.join(machine['isa'])})",
          "machine": machine, "host_kernels": host_kernels(),
          "jax": jax.__version__, "python": platform.python_version(),
          "benchmark": "benchmarks/cpu_decode.py " + " ".join(argv if argv is not None
                                                              else sys.argv[1:]),
          "evict_mib": a.evict_mib,
          "load_average_before": [round(x, 2) for x in load_before],
          "load_average_after": [round(x, 2) for x in os.getloadavg()],
          "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
  print(json.dumps(meta))
  if a.out:
    write(a.out, rows, meta)
  return rows, meta


if __name__ == "__main__":
  main()
