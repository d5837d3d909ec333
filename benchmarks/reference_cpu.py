"""Time and memory of the reference decode on the CPU at a DeepSeek-V4 shape.

Usage: python benchmarks/reference_cpu.py [--tokens 64] [--heads 128] [--len 8192] [--repeats 3]
Prints the median time per call and the compiled executable's temporary memory; run it under
`/usr/bin/time -v` for the process's peak RSS.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_mla


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--tokens", type=int, default=64)
  p.add_argument("--heads", type=int, default=128)
  p.add_argument("--len", type=int, default=8192)
  p.add_argument("--pool", type=int, default=65536)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--backend", default="reference")
  a = p.parse_args()
  key = jax.random.PRNGKey(0)
  q, q_rope = jax_mla.pack_rows(jax.random.normal(key, (a.tokens, a.heads, 512)) * 0.05)
  kv, kv_rope = jax_mla.pack_rows(jax.random.normal(key, (a.pool, 512)))
  kv_indptr = jnp.arange(a.tokens + 1, dtype=jnp.int32) * a.len
  kv_indices = jax.random.randint(key, (a.tokens * a.len,), 0, a.pool, jnp.int32)
  sink = jnp.zeros((a.heads,), jnp.float32)
  args = (q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink)
  f = jax.jit(lambda *x: jax_mla.decode(*x, backend=a.backend))
  compiled = f.lower(*args).compile()
  mem = compiled.memory_analysis()
  jax.block_until_ready(f(*args))
  times = []
  for _ in range(a.repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    times.append(time.perf_counter() - t0)
  med = float(np.median(times))
  flops = 2.0 * a.tokens * a.heads * a.len * 1024
  print(f"{a.backend}: T={a.tokens} H={a.heads} K={a.len}: median {med:.3f} s over {a.repeats} "
        f"({flops / med / 1e9:.1f} GFLOP/s); temp memory "
        f"{(mem.temp_size_in_bytes if mem else float('nan')) / 2**20:.1f} MiB")


if __name__ == "__main__":
  main()
