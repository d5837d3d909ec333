"""A KV pool of 2^23 + 5 rows (uint8 4 GiB + bf16 rope 1 GiB): row byte offsets pass 2^32, so a
32-bit offset anywhere (row * 512 in int32 or uint32) reads the wrong row. The reference, the host
split path and the host persistent path each decode rows at the very end of the pool, rows just
above and below 2^23, and row 0, and must agree with the float64 oracle.

The pool is built inside the jit (zeros, then the few live rows scattered in) so only one 5 GiB
copy exists, and all three backends read that same buffer.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mla
from support.compare import assert_close
from support.oracle import oracle_decode
from support.rows import make_batch

NUM_ROWS = 2**23 + 5
# Where the small test pool's rows live in the big one: the last rows, both sides of 2^23, row 0.
BIG_ROWS = np.array([NUM_ROWS - 1, NUM_ROWS - 2, 2**23, 2**23 - 1, 2**23 + 1, 0, NUM_ROWS - 3,
                     2**22 + 3], np.int64)
assert len(set(BIG_ROWS.tolist())) == len(BIG_ROWS)  # a duplicate would make the scatter ambiguous


@pytest.fixture(scope="module")
def batch():
  b = make_batch(np.random.default_rng(5), num_heads=128, lengths=[7, 0, 40, 1],
                 pool_rows=len(BIG_ROWS), sink=0.75, index_pattern="random")
  b.kv_indices[:3] = [0, 0, 1]  # make sure the very last row is used
  return b


def check(name, batch, out, lse):
  want_out, want_lse = oracle_decode(*batch.args(), 1)
  out = np.asarray(jnp.asarray(out, jnp.float32))
  lse = np.asarray(lse)
  assert np.isfinite(out).all() and np.isfinite(lse).all(), name
  scale = np.abs(want_out).max()
  assert_close(f"{name} out", out, want_out, atol=scale * 2.0**-7, rtol=2.0**-8, cos_tol=1e-5)
  assert_close(f"{name} lse", lse, want_lse, atol=2e-4 * max(1.0, np.abs(want_lse).max()),
               rtol=1e-5, cos_tol=None)


def test_rows_past_4_gib_on_every_cpu_backend(batch):
  big_indices = BIG_ROWS[batch.kv_indices].astype(np.int32)
  assert big_indices.max() == NUM_ROWS - 1 and (big_indices >= 2**23).any()
  host = jax_mla._src.backends.host_available()[0]  # pylint: disable=protected-access

  @jax.jit
  def run(q, q_rope, small_kv, small_rope, kv_indptr, kv_indices, sink, ws):
    kv = jnp.zeros((NUM_ROWS, 512), jnp.uint8).at[BIG_ROWS].set(small_kv)
    kv_rope = jnp.zeros((NUM_ROWS, 64), jnp.bfloat16).at[BIG_ROWS].set(small_rope)
    args = (q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink)
    results = {"reference": jax_mla.decode(*args, backend="reference")}
    if host:
      results["host split"] = jax_mla.decode(*args, backend="host", num_kv_splits=3)
      results["host persistent"] = jax_mla.decode_persistent(*args, ws, backend="host")[:2]
    return results

  results = run(batch.q, batch.q_rope, batch.kv, batch.kv_rope, batch.kv_indptr, big_indices,
                batch.sink, jax_mla.make_workspace(8, 4))
  assert set(results) == ({"reference", "host split", "host persistent"} if host
                          else {"reference"})
  for name, (out, lse) in results.items():
    check(name, batch, out, lse)
