"""Child process of test_gfx950_subprocess.py: runs both kernels once under the environment the
parent set (allocator, XLA_FLAGS) and saves the outputs to the .npz named by argv[2].

argv[1] = "guard": every input sized to a whole number of 2 MiB allocation granules, with the
used rows, indices and query rows at the very end, so a one-element over-read crosses into the
next (with the platform allocator, separately mapped) allocation.
argv[1] = "scan": a jitted lax.scan decode loop with changing lengths (command-buffer test).
"""

import sys

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_mla  # noqa: E402
from support.rows import make_batch  # noqa: E402

GRANULE = 2 << 20


def guard():
  pool = GRANULE // 128 * 4  # kv: pool*512 B and kv_rope: pool*128 B are whole granules
  n = GRANULE // (128 * 64 * 2)  # q_rope [n,128,64] bf16 is one granule; q [n,128,512] four
  num_indices = GRANULE // 4
  rng = np.random.default_rng(0)
  lengths = np.zeros(n, np.int64)
  lengths[-3:] = [1, 37, 300]  # the last query rows hold the work
  batch = make_batch(rng, num_heads=128, lengths=lengths, pool_rows=pool, sink=0.5,
                     index_pattern="last", extra_indices=0)
  used = int(lengths.sum())
  indices = np.full(num_indices, pool - 1, np.int32)  # used entries are the last ones
  indices[-used:] = pool - 1 - rng.integers(0, 4, used)
  indptr = (np.concatenate([[0], np.cumsum(lengths)]) + (num_indices - used)).astype(np.int32)
  sink = np.full(128, 0.5, np.float32)
  out_split, lse_split = jax.jit(lambda *a: jax_mla.decode(*a, backend="gfx950"))(
      batch.q, batch.q_rope, batch.kv, batch.kv_rope,
      (indptr - indptr[0]).astype(np.int32), indices[num_indices - used:], sink)
  out_ps, lse_ps, _ = jax.jit(lambda *a: jax_mla.decode_persistent(*a, backend="gfx950"))(
      batch.q, batch.q_rope, batch.kv, batch.kv_rope, indptr, indices, sink,
      jax_mla.make_workspace(128, n))
  return {"out_split": out_split[-3:], "lse_split": lse_split[-3:], "out_ps": out_ps[-3:],
          "lse_ps": lse_ps[-3:]}


def scan():
  rng = np.random.default_rng(21)
  base = make_batch(rng, num_heads=128, lengths=[0] * 4, pool_rows=4096, sink=0.3)
  lengths = np.array([[0, 1, 40, 7], [1, 2, 41, 0], [2, 300, 42, 0], [2047, 303, 1, 3]])
  indptr = np.concatenate([np.zeros((4, 1)), np.cumsum(lengths, 1)], 1).astype(np.int32)
  indices = rng.integers(0, 4096, (4, 2400)).astype(np.int32)

  def step(ws, xs):
    ptr, idx = xs
    o1, l1 = jax_mla.decode(base.q, base.q_rope, base.kv, base.kv_rope, ptr, idx, base.sink,
                            backend="gfx950")
    o2, l2, ws = jax_mla.decode_persistent(base.q, base.q_rope, base.kv, base.kv_rope, ptr, idx,
                                           base.sink, ws, backend="gfx950")
    return ws, (o1, l1, o2, l2)

  _, (o1, l1, o2, l2) = jax.jit(lambda ws, p, i: jax.lax.scan(step, ws, (p, i)))(
      jax_mla.make_workspace(128, 4), indptr, indices)
  return {"out_split": o1, "lse_split": l1, "out_ps": o2, "lse_ps": l2}


if __name__ == "__main__":
  result = {"guard": guard, "scan": scan}[sys.argv[1]]()
  np.savez(sys.argv[2], **{k: np.asarray(jnp.asarray(v, jnp.float32)) for k, v in result.items()})
  print("child ok")
