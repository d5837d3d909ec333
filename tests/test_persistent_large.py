"""N = 32768, the kernel's row limit, on the host backend: a few rows with KV entries, the rest
empty. Inputs are built inside the jit and only the rows checked come back, to keep the 2 GiB q
and 4 GiB out off the host side."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from support.persistent_cases import check_against_oracle
from jax_mla._src.aiter.persistent import decode_persistent
from jax_mla._src.workspace import make_workspace
from support.rows import make_batch

N = 32768


@pytest.mark.slow
def test_n_32768_rows():
  live = np.array([0, 1, 16383, N - 1])
  lengths = np.array([1, 5, 40, 3])
  small = make_batch(np.random.default_rng(0), num_heads=128, lengths=lengths, pool_rows=64,
                     sink=0.5)
  k = np.zeros(N, np.int64)
  k[live] = lengths
  kv_indptr = np.concatenate([[0], np.cumsum(k)]).astype(np.int32)
  checked = np.concatenate([live, [2, 20000, N - 2]])

  @jax.jit
  def run(ws, q_live, q_rope_live, kv, kv_rope, kv_indices, sink):
    q = jnp.zeros((N, 128, 512), jnp.uint8).at[live].set(q_live)
    q_rope = jnp.zeros((N, 128, 64), jnp.bfloat16).at[live].set(q_rope_live)
    out, lse, ws = decode_persistent(q, q_rope, kv, kv_rope, jnp.asarray(kv_indptr), kv_indices,
                                     sink, ws)
    return out[checked], lse[checked], ws

  out, lse, ws = run(make_workspace(128), small.q, small.q_rope, small.kv, small.kv_rope,
                     small.kv_indices, small.sink)
  out = np.asarray(jnp.asarray(out, jnp.float32))
  lse = np.asarray(lse)
  check_against_oracle(small, out[:4], lse[:4])
  assert (out[4:] == 0).all()
  np.testing.assert_array_equal(lse[4:], np.broadcast_to(small.sink, (3, 128)))
  assert not np.asarray(ws.cnt).any()
