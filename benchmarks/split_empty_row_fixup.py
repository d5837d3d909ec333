"""What zeroing the K = 0 rows of the S == 1 output costs on the host (XLA:CPU), T=64, H=128.

(1) The fix-up alone on a donated bf16 [64, 128, 512] buffer: none / row scatter / select pass.
(2) The whole host-backend decode (short rows, so the fix-up is visible) with each fix-up.
Interleaved rounds; medians. Run: PYTHONPATH=src:tests python benchmarks/split_empty_row_fixup.py
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

from rows import make_batch
from jax_mla._src import split_kernel

T, H = 64, 128
FIXUPS = {"none": lambda out, *_: out, "scatter": split_kernel.zero_empty_rows_scatter,
          "select": split_kernel.zero_empty_rows_select}


def timed(fns, make_args, rounds):
  times = {name: [] for name in fns}
  for name, f in fns.items():
    jax.block_until_ready(f(*make_args()))
  for _ in range(rounds):
    for name, f in fns.items():
      args = make_args()
      jax.block_until_ready(args)
      t0 = time.perf_counter()
      jax.block_until_ready(f(*args))
      times[name].append(time.perf_counter() - t0)
  return {name: float(np.median(ts)) * 1e6 for name, ts in times.items()}


def main(rounds=30):
  rng = np.random.default_rng(0)
  lengths = rng.integers(0, 4, size=T)  # ~1/4 of the sequences empty
  batch = make_batch(rng, num_heads=H, lengths=lengths, pool_rows=256)
  kv_indptr = jnp.asarray(batch.kv_indptr)
  print(f"T={T} H={H}, {int(np.sum(lengths == 0))} empty rows")

  alone = {n: jax.jit(lambda o, k, f=f: f(o, k, 1), donate_argnums=0) for n, f in FIXUPS.items()}
  res = timed(alone, lambda: (jnp.ones((T, H, 512), jnp.bfloat16), kv_indptr), rounds)
  print("fix-up alone:   " + "  ".join(f"{n} {us:8.0f} us" for n, us in res.items()))

  args = batch.args()[:-1] + (np.full(H, -np.inf, np.float32),)
  decode = {}
  for name, fixup in FIXUPS.items():
    def fn(*a, fixup=fixup):
      table = dict(split_kernel.ZERO_EMPTY_ROWS)
      split_kernel.ZERO_EMPTY_ROWS["host"] = fixup
      try:
        return split_kernel.split_decode(*a, tokens_per_seq=1, num_kv_splits=1, backend="host",
                                         return_lse=False, fill_unwritten_nan=False)[0]
      finally:
        split_kernel.ZERO_EMPTY_ROWS.update(table)
    decode[name] = jax.jit(fn)
  res = timed(decode, lambda: args, rounds)
  print("whole decode:   " + "  ".join(f"{n} {us:8.0f} us" for n, us in res.items()))


if __name__ == "__main__":
  main()
