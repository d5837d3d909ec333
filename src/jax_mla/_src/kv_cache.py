"""Helpers a jitted decoder needs every step: writing new KV rows, and index-layout conversion."""

from __future__ import annotations

import jax.numpy as jnp

from jax_mla._src import checks, layout


def update_cache(kv, kv_rope, x, slots):
  """Packs new KV rows and writes them into the pool.

  Args:
    kv: uint8 `[R, 512]` packed pool.
    kv_rope: bf16 `[R, 64]` RoPE pool.
    x: f32 or bf16 `[n, 512]` new rows (unquantized).
    slots: int32 `[n]` pool rows to write; a negative slot skips its row (padding). Slots must
      be unique among the non-negative ones (which duplicate wins is unspecified).

  Returns:
    `(kv, kv_rope)` updated. Under `jax.jit(..., donate_argnums=(0, 1))` the pool is updated in
    place: XLA aliases the donated pool to the result, no pool-sized copy.
  """
  checks.check_array("kv", kv, ndim=2, dtype=jnp.uint8, last=layout.ROW_BYTES)
  checks.check_array("kv_rope", kv_rope, ndim=2, dtype=jnp.bfloat16, last=layout.ROPE_DIM)
  if kv_rope.shape[0] != kv.shape[0]:
    raise ValueError(f"kv_rope must have shape ({kv.shape[0]}, {layout.ROPE_DIM}); got "
                     f"{tuple(kv_rope.shape)}")
  if not hasattr(x, "dtype") or jnp.dtype(x.dtype) not in (jnp.dtype(jnp.float32),
                                                          jnp.dtype(jnp.bfloat16)):
    raise TypeError(f"x must be an f32 or bf16 array; got {getattr(x, 'dtype', type(x))}")
  if x.ndim != 2 or x.shape[1] != layout.HEAD_DIM:
    raise ValueError(f"x must have shape [n, {layout.HEAD_DIM}]; got {tuple(x.shape)}")
  checks.check_array("slots", slots, ndim=1, dtype=jnp.int32)
  if slots.shape[0] != x.shape[0]:
    raise ValueError(f"slots must have shape ({x.shape[0]},) (one per row of x); got "
                     f"{tuple(slots.shape)}")
  packed, rope = layout.pack_rows(x)
  # Negative slots become out-of-range ones, which mode="drop" skips.
  rows = jnp.where(slots < 0, kv.shape[0], slots)
  kv = kv.at[rows].set(packed, mode="drop", unique_indices=False)
  kv_rope = kv_rope.at[rows].set(rope, mode="drop", unique_indices=False)
  return kv, kv_rope


def ragged_from_topk(indices, lengths=None):
  """Converts fixed-width index buffers (FlashMLA's layout) into `kv_indptr` / `kv_indices`.

  Args:
    indices: int32 `[num_seqs, topk]` pool rows; entries of -1 (any negative) are unused.
    lengths: optional int32 `[num_seqs]`; entries at or past `lengths[b]` are unused too.

  Returns:
    `(kv_indptr int32 [num_seqs + 1], kv_indices int32 [num_seqs * topk])`: the used entries of
    each row, in order, packed end to end; the tail past `kv_indptr[-1]` is 0 (never read). All
    on the device with static shapes: no host reads, one executable for any contents.
  """
  checks.check_array("indices", indices, ndim=2, dtype=jnp.int32)
  num_seqs, topk = indices.shape
  used = indices >= 0
  if lengths is not None:
    checks.check_array("lengths", lengths, ndim=1, dtype=jnp.int32)
    if lengths.shape[0] != num_seqs:
      raise ValueError(f"lengths must have shape ({num_seqs},); got {tuple(lengths.shape)}")
    used &= jnp.arange(topk, dtype=jnp.int32)[None, :] < lengths[:, None]
  counts = jnp.sum(used, axis=1, dtype=jnp.int32)
  kv_indptr = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(counts, dtype=jnp.int32)])
  slot = kv_indptr[:-1, None] + jnp.cumsum(used, axis=1, dtype=jnp.int32) - 1
  slot = jnp.where(used, slot, num_seqs * topk)  # unused entries land out of range: dropped
  kv_indices = jnp.zeros((num_seqs * topk,), jnp.int32).at[slot.reshape(-1)].set(
      indices.reshape(-1), mode="drop")
  return kv_indptr, kv_indices
