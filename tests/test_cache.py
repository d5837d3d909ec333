"""update_cache and ragged_from_topk against NumPy, and the pool aliasing under donation."""

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_mla


def test_update_cache_writes_packed_rows_and_skips_negative_slots():
  rng = np.random.default_rng(0)
  kv = rng.integers(0, 256, size=(32, 512), dtype=np.uint8)
  kv_rope = rng.standard_normal((32, 64)).astype(ml_dtypes.bfloat16)
  x = rng.standard_normal((5, 512)).astype(np.float32)
  slots = np.array([3, -1, 31, 0, 7], np.int32)
  new_kv, new_rope = jax.jit(jax_mla.update_cache)(kv, kv_rope, x, slots)
  packed, rope = jax_mla.pack_rows(jnp.asarray(x))
  want_kv, want_rope = kv.copy(), kv_rope.copy()
  for i, s in enumerate(slots):
    if s >= 0:
      want_kv[s] = np.asarray(packed)[i]
      want_rope[s] = np.asarray(rope)[i]
  np.testing.assert_array_equal(np.asarray(new_kv), want_kv)
  np.testing.assert_array_equal(np.asarray(new_rope), want_rope)


def test_update_cache_is_in_place_when_donated():
  kv = jnp.zeros((4096, 512), jnp.uint8)
  kv_rope = jnp.zeros((4096, 64), jnp.bfloat16)
  x = jnp.ones((8, 512), jnp.float32)
  slots = jnp.arange(8, dtype=jnp.int32)
  step = jax.jit(jax_mla.update_cache, donate_argnums=(0, 1))
  hlo = step.lower(kv, kv_rope, x, slots).compile().as_text()
  aliases = re.search(r"input_output_alias=\{(.*?)\}, entry_computation_layout", hlo)
  assert aliases, "the compiled module aliases no input to an output"
  assert "{0}: (0, {}" in aliases.group(1) and "{1}: (1, {}" in aliases.group(1), aliases.group(1)
  # No pool-sized copy: any copy of a u8[4096,512] would be a full extra pass over the pool.
  assert not re.search(r"u8\[4096,512\][^\n]*\bcopy\(", hlo), "pool is copied"
  new_kv, _ = step(kv, kv_rope, x, slots)
  # Rows of ones: scale 2^ceil(log2(1 / 448)) = 2^-8 -> e8m0 byte 119, written in place.
  assert (np.asarray(new_kv)[:8, 448:462] == 119).all() and not np.asarray(new_kv)[8:].any()


def _numpy_ragged(indices, lengths):
  indptr, flat = [0], []
  for b, row in enumerate(indices):
    limit = len(row) if lengths is None else lengths[b]
    used = [int(v) for j, v in enumerate(row) if v >= 0 and j < limit]
    flat += used
    indptr.append(indptr[-1] + len(used))
  return np.array(indptr, np.int32), np.array(flat, np.int32)


@pytest.mark.parametrize("with_lengths", [False, True])
def test_ragged_from_topk_matches_numpy(with_lengths):
  rng = np.random.default_rng(1)
  topk = 16
  indices = rng.integers(0, 1000, size=(6, topk)).astype(np.int32)
  indices[rng.random(indices.shape) < 0.3] = -1
  indices[2] = -1  # a row with nothing
  lengths = np.array([0, topk, 5, 16, 1, 9], np.int32) if with_lengths else None
  indptr, flat = jax.jit(jax_mla.ragged_from_topk)(indices, lengths)
  want_indptr, want_flat = _numpy_ragged(indices, lengths)
  np.testing.assert_array_equal(np.asarray(indptr), want_indptr)
  assert flat.shape == (6 * topk,)
  np.testing.assert_array_equal(np.asarray(flat)[:want_indptr[-1]], want_flat)
  assert not np.asarray(flat)[want_indptr[-1]:].any()  # the unread tail is 0


def test_ragged_from_topk_feeds_decode():
  rng = np.random.default_rng(2)
  kv, kv_rope = jax_mla.pack_rows(jnp.asarray(rng.standard_normal((64, 512)), jnp.float32))
  q, q_rope = jax_mla.pack_rows(jnp.asarray(rng.standard_normal((2, 16, 512)), jnp.float32))
  indices = np.array([[5, -1, 7, 9], [-1, -1, -1, -1]], np.int32)
  indptr, flat = jax_mla.ragged_from_topk(indices)
  out, lse = jax_mla.decode(q, q_rope, kv, kv_rope, indptr, flat, backend="reference")
  direct = jax_mla.decode(q[:1], q_rope[:1], kv, kv_rope, jnp.array([0, 3], jnp.int32),
                          jnp.array([5, 7, 9], jnp.int32), backend="reference")
  np.testing.assert_array_equal(np.asarray(out[:1], np.float32), np.asarray(direct[0], np.float32))
  assert np.all(np.asarray(lse[1]) == -np.inf)


def test_cache_helper_errors_name_the_argument():
  kv = jnp.zeros((4, 512), jnp.uint8)
  rope = jnp.zeros((4, 64), jnp.bfloat16)
  with pytest.raises(ValueError, match=r"x must have shape \[n, 512\]"):
    jax_mla.update_cache(kv, rope, jnp.zeros((2, 448)), jnp.zeros(2, jnp.int32))
  with pytest.raises(ValueError, match=r"slots must have shape \(2,\)"):
    jax_mla.update_cache(kv, rope, jnp.zeros((2, 512)), jnp.zeros(3, jnp.int32))
  with pytest.raises(TypeError, match="indices must have dtype int32"):
    jax_mla.ragged_from_topk(jnp.zeros((2, 4), jnp.int64 if jax.config.jax_enable_x64 else
                                       jnp.float32))
  with pytest.raises(ValueError, match=r"lengths must have shape \(2,\)"):
    jax_mla.ragged_from_topk(jnp.zeros((2, 4), jnp.int32), jnp.zeros(3, jnp.int32))
