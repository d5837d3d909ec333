"""The reference decode against the independent float64 oracle, and its contracts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mla
from support.compare import assert_bf16_decode_close
from support.oracle import oracle_decode
from support.rows import make_batch

def check_against_oracle(batch, out, lse):
  out = np.asarray(jnp.asarray(out, jnp.float32))
  assert_bf16_decode_close(out, np.asarray(lse),
                           *oracle_decode(*batch.args(), batch.tokens_per_seq))


def test_jit_and_eager_agree_and_lengths_do_not_recompile():
  rng = np.random.default_rng(9)
  traces = []

  def f(*args):
    traces.append(1)
    return jax_mla.decode(*args, backend="reference")

  jitted = jax.jit(f)
  first = make_batch(rng, num_heads=16, lengths=[10, 20, 30])
  out_j, lse_j = jitted(*first.args())
  out_e, lse_e = jax_mla.decode(*first.args(), backend="reference")
  np.testing.assert_array_equal(np.asarray(out_j, np.float32), np.asarray(out_e, np.float32))
  np.testing.assert_array_equal(np.asarray(lse_j), np.asarray(lse_e))
  for lengths in ([0, 0, 60], [59, 1, 0], [1, 2, 57]):  # same total, so same index-buffer shape
    batch = make_batch(rng, num_heads=16, lengths=lengths)
    out, lse = jitted(*batch.args())
    check_against_oracle(batch, out, lse)
  assert len(traces) == 1


def test_return_lse_false():
  batch = make_batch(np.random.default_rng(10), num_heads=16, lengths=[3])
  out, lse = jax_mla.decode(*batch.args(), backend="reference", return_lse=False)
  assert lse is None and out.shape == (1, 16, 512)


def test_long_rows_stay_bounded_in_memory():
  """A chunked walk: 64 x 128 heads x 2048 entries compiles to temporaries far below the
  [T, H, K, 512] (16 GiB) a naive gather would need."""
  rng = np.random.default_rng(11)
  batch = make_batch(rng, num_heads=128, lengths=[2048] * 64, pool_rows=4096)
  args = [jnp.asarray(a) for a in batch.args()[:-1]]
  compiled = jax.jit(lambda *a: jax_mla.decode(*a, backend="reference")).lower(*args).compile()
  memory = compiled.memory_analysis()
  if memory is None:
    pytest.skip("this jaxlib reports no memory analysis")
  assert memory.temp_size_in_bytes < 512 * 2**20, memory.temp_size_in_bytes
