"""Time and memory of the reference decode on the CPU at a DeepSeek-V4 shape.

Usage: python benchmarks/reference_cpu.py [--tokens 64] [--heads 128] [--len 8192] [--repeats 3]
                                          [--backend reference] [--json PATH]
Prints the median time per call and the compiled executable's temporary memory; run it under
`/usr/bin/time -v` for the process's peak RSS. `--tokens`, `--len` and `--backend` take several
values to sweep them in one process. `--backend`: reference, host or auto (through
`jax_mla.decode`), or host-persistent (`jax_mla.decode_persistent` on the host backend, P = 128).
`--json PATH` also writes the results as `{"meta": {...}, "rows": [...]}` (the schema of
benchmarks/results/*.json, read by notebooks/performance.md); rows already in PATH are kept, a row
with the same shape and backend is replaced.
"""

import argparse
import datetime
import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_mla

PERSISTENT_PARTITIONS = 128  # P of the workspace for --backend host-persistent

def run_one(tokens, heads, kv_len, pool, repeats, backend):
  key = jax.random.PRNGKey(0)
  q, q_rope = jax_mla.pack_rows(jax.random.normal(key, (tokens, heads, 512)) * 0.05)
  kv, kv_rope = jax_mla.pack_rows(jax.random.normal(key, (pool, 512)))
  kv_indptr = jnp.arange(tokens + 1, dtype=jnp.int32) * kv_len
  kv_indices = jax.random.randint(key, (tokens * kv_len,), 0, pool, jnp.int32)
  sink = jnp.zeros((heads,), jnp.float32)
  args = (q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink)
  if backend == "host-persistent":  # decode_persistent on the host backend (128 heads)
    # The workspace is threaded through the calls and donated, as a decoder would use it.
    step = jax.jit(lambda ws, *x: jax_mla.decode_persistent(*x, ws, backend="host"),
                   donate_argnums=0)
    state = {"ws": jax_mla.make_workspace(num_partitions=PERSISTENT_PARTITIONS, max_rows=tokens)}
    mem = step.lower(state["ws"], *args).compile().memory_analysis()

    def f(*x):
      out, lse, state["ws"] = step(state["ws"], *x)
      return out, lse
  else:
    f = jax.jit(lambda *x: jax_mla.decode(*x, backend=backend))
    mem = f.lower(*args).compile().memory_analysis()
  jax.block_until_ready(f(*args))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    times.append(time.perf_counter() - t0)
  med = float(np.median(times))
  flops = 2.0 * tokens * heads * kv_len * 1024
  temp = mem.temp_size_in_bytes / 2**20 if mem else float("nan")
  print(f"{backend}: T={tokens} H={heads} K={kv_len}: median {med:.3f} s over {repeats} "
        f"({flops / med / 1e9:.1f} GFLOP/s); temp memory {temp:.1f} MiB")
  return {"heads": heads, "tokens_per_seq": 1, "batch": tokens, "kv_len": kv_len,
          "impl": backend, "us": med * 1e6, "us_min": float(np.min(times)) * 1e6,
          "us_max": float(np.max(times)) * 1e6, "gflops": flops / med / 1e9,
          "temp_mib": temp, "repeats": repeats}


def write_json(path, rows):
  meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "device": f"CPU ({platform.processor() or platform.machine()}, "
                    f"{os.cpu_count()} logical cores visible)",
          "jax": jax.__version__, "python": platform.python_version(),
          "benchmark": "benchmarks/reference_cpu.py",
          # Other work on the machine skews CPU timings: the 1-minute load average when done.
          "load_average": round(os.getloadavg()[0], 2)}
  old = []
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f).get("rows", [])
  shape = lambda r: (r["heads"], r["batch"], r["kv_len"], r["impl"])  # noqa: E731
  new = {shape(r) for r in rows}
  rows = [r for r in old if shape(r) not in new] + rows
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    json.dump({"meta": meta, "rows": rows}, f, indent=1)
    f.write("\n")


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--tokens", type=int, nargs="+", default=[64])
  p.add_argument("--heads", type=int, default=128)
  p.add_argument("--len", type=int, nargs="+", default=[8192])
  p.add_argument("--pool", type=int, default=65536)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--backend", nargs="+", default=["reference"])
  p.add_argument("--json", metavar="PATH", help="also write the results to this JSON file")
  a = p.parse_args()
  rows = [run_one(t, a.heads, k, a.pool, a.repeats, b)
          for b in a.backend for t in a.tokens for k in a.len]
  if a.json:
    write_json(a.json, rows)


if __name__ == "__main__":
  main()
