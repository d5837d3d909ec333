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


def _numpy_pool_rows(local, page_table=None, page_size=None, base=None):
  """The mapping written as a loop, one entry at a time (pool_rows's docstring)."""
  out = np.full(local.shape, -1, np.int64)
  for idx in np.ndindex(*local.shape):
    b, i = idx[0], int(local[idx])
    if i < 0:
      continue
    if base is not None:
      row = int(base[b]) + i
    else:
      if i // page_size >= page_table.shape[1] or page_table[b, i // page_size] < 0:
        continue
      row = int(page_table[b, i // page_size]) * page_size + i % page_size
    out[idx] = row if row >= 0 else -1
  return out.astype(np.int32)


def _local_indices(rng, shape, high):
  local = rng.integers(0, high, size=shape).astype(np.int32)
  local[rng.random(shape) < 0.25] = -1
  local[rng.random(shape) < 0.05] = -7  # any negative is unused
  return local


@pytest.mark.parametrize("shape", [(5, 12), (5, 3, 12)], ids=["per-seq", "per-token"])
def test_pool_rows_through_a_page_table_matches_numpy(shape):
  rng = np.random.default_rng(3)
  page_size, pages_per_seq = 4, 6
  page_table = rng.permutation(64)[:5 * pages_per_seq].reshape(5, pages_per_seq).astype(np.int32)
  page_table[1, 4:] = -1  # unallocated pages
  local = _local_indices(rng, shape, page_size * pages_per_seq + 6)  # some past the table
  local[0, ..., 0] = page_size * pages_per_seq  # the first index past the table
  local[2] = -1  # a sequence with nothing
  local[1, ..., 1] = 17  # page 4 of sequence 1: unallocated
  f = jax.jit(jax_mla.pool_rows, static_argnames="page_size")
  rows = np.asarray(f(local, page_table=page_table, page_size=page_size))
  want = _numpy_pool_rows(local, page_table=page_table, page_size=page_size)
  assert rows.dtype == np.int32 and rows.shape == shape
  np.testing.assert_array_equal(rows, want)
  assert (rows[0, ..., 0] == -1).all() and (rows[1, ..., 1] == -1).all() and (rows[2] == -1).all()
  assert (rows[local >= 0] >= 0).sum() < (local >= 0).sum()  # past-table entries dropped
  # Every used row lies on a page of its own sequence.
  for idx in zip(*np.nonzero(rows >= 0)):
    assert rows[idx] // page_size in page_table[idx[0]]
  empty_table = np.zeros((5, 0), np.int32)
  assert (np.asarray(f(local, page_table=empty_table, page_size=page_size)) == -1).all()


@pytest.mark.parametrize("shape", [(4, 10), (4, 2, 10)], ids=["per-seq", "per-token"])
def test_pool_rows_from_a_base_matches_numpy(shape):
  rng = np.random.default_rng(4)
  base = np.array([0, 100, 37, 5000], np.int32)
  local = _local_indices(rng, shape, 90)
  rows = np.asarray(jax.jit(jax_mla.pool_rows)(local, base=base))
  np.testing.assert_array_equal(rows, _numpy_pool_rows(local, base=base))
  np.testing.assert_array_equal(rows[local >= 0], (base.reshape(-1, *[1] * (len(shape) - 1))
                                                   + local)[local >= 0])
  assert (rows[local < 0] == -1).all()


def test_pool_rows_feed_ragged_from_topk_and_decode():
  rng = np.random.default_rng(5)
  kv, kv_rope = jax_mla.pack_rows(jnp.asarray(rng.standard_normal((64, 512)), jnp.float32))
  page_size = 8
  page_table = np.array([[3, 0, -1], [7, 5, 1]], np.int32)
  local = np.array([[[0, 9, -1, 30], [1, -1, -1, -1]],
                    [[17, 2, 8, -1], [-1, -1, -1, -1]]], np.int32)  # [2 seqs, 2 tokens, 4]
  rows = jax_mla.pool_rows(local, page_table=page_table, page_size=page_size)
  # By hand: seq 0 page 0 -> pool page 3 (rows 24..31), page 1 -> 0; 30 is on page 3: past the
  # table. Seq 1 pages 7, 5, 1.
  want = np.array([[[24, 1, -1, -1], [25, -1, -1, -1]], [[9, 58, 40, -1], [-1, -1, -1, -1]]])
  np.testing.assert_array_equal(np.asarray(rows), want)
  indptr, flat = jax_mla.ragged_from_topk(rows.reshape(4, 4))
  np.testing.assert_array_equal(np.asarray(indptr), [0, 2, 3, 6, 6])
  np.testing.assert_array_equal(np.asarray(flat)[:6], [24, 1, 25, 9, 58, 40])
  q, q_rope = jax_mla.pack_rows(jnp.asarray(rng.standard_normal((4, 16, 512)), jnp.float32))
  out, lse = jax_mla.decode(q, q_rope, kv, kv_rope, indptr, flat, backend="reference")
  direct = jax_mla.decode(q[:3], q_rope[:3], kv, kv_rope, jnp.array([0, 2, 3, 6], jnp.int32),
                          jnp.array([24, 1, 25, 9, 58, 40], jnp.int32), backend="reference")
  np.testing.assert_array_equal(np.asarray(out[:3], np.float32), np.asarray(direct[0], np.float32))
  assert np.all(np.asarray(lse[3]) == -np.inf)


def test_pool_rows_errors_name_the_argument():
  local = jnp.zeros((2, 4), jnp.int32)
  table = jnp.zeros((2, 3), jnp.int32)
  with pytest.raises(ValueError, match="exactly one of page_table .* and base; got neither"):
    jax_mla.pool_rows(local)
  with pytest.raises(ValueError, match="exactly one of page_table .* and base; got both"):
    jax_mla.pool_rows(local, page_table=table, page_size=4, base=jnp.zeros(2, jnp.int32))
  with pytest.raises(ValueError, match="page_table needs page_size"):
    jax_mla.pool_rows(local, page_table=table)
  with pytest.raises(ValueError, match="page_size is only used with page_table"):
    jax_mla.pool_rows(local, base=jnp.zeros(2, jnp.int32), page_size=4)
  with pytest.raises(ValueError, match="page_size must be a positive int"):
    jax_mla.pool_rows(local, page_table=table, page_size=0)
  with pytest.raises(TypeError, match="page_size must be a positive int"):
    jax_mla.pool_rows(local, page_table=table, page_size=jnp.int32(4))
  with pytest.raises(TypeError, match="local must have dtype int32"):
    jax_mla.pool_rows(local.astype(jnp.float32), base=jnp.zeros(2, jnp.int32))
  with pytest.raises(ValueError, match=r"local must have shape \[num_seqs, topk\] or"):
    jax_mla.pool_rows(jnp.zeros(4, jnp.int32), base=jnp.zeros(2, jnp.int32))
  with pytest.raises(ValueError, match=r"page_table must have shape \(2, pages_per_seq\)"):
    jax_mla.pool_rows(local, page_table=jnp.zeros((3, 3), jnp.int32), page_size=4)
  with pytest.raises(TypeError, match="page_table must have dtype int32"):
    jax_mla.pool_rows(local, page_table=table.astype(jnp.uint32), page_size=4)
  with pytest.raises(ValueError, match=r"base must have shape \(2,\)"):
    jax_mla.pool_rows(local, base=jnp.zeros(3, jnp.int32))
