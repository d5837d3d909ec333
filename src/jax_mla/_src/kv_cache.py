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


def pool_rows(local, *, page_table=None, page_size=None, base=None):
  """Maps sequence-local KV indices to pool rows, on the device.

  Servers keep top-k indices local to each sequence: tpu-inference and vLLM map them through a
  page table (`page_indices` / `block_tables`), MaxText-style caches through a per-sequence base
  row. `ragged_from_topk` and `decode` take pool rows; this converts, with static shapes and no
  host reads (one executable for any contents).

  Args:
    local: int32 `[num_seqs, topk]`, or `[num_seqs, tokens, topk]` with one index list per query
      token; entry `i` of sequence `b` is the sequence's `i`-th KV token. Negative entries are
      unused.
    page_table: int32 `[num_seqs, pages_per_seq]`, with static `page_size`: local index `i` is
      pool row `page_table[b, i // page_size] * page_size + i % page_size` (the numbering
      `to_tpu_inference` / `to_flashmla` keep: page `p`, slot `s` is row `p * page_size + s`).
    page_size: tokens per page, a positive Python int; only with `page_table`.
    base: int32 `[num_seqs]`: local index `i` is pool row `base[b] + i` (each sequence's rows
      contiguous from its base).

  Exactly one of `page_table` and `base` is given.

  Returns:
    int32 with the shape of `local`: the pool rows, -1 where the entry is unused. An entry is
    unused (-1) when the local index is negative, when its page is past the page table
    (`i // page_size >= pages_per_seq`) or the table's entry for that page is negative (an
    unallocated page), or when `base[b] + i` is negative. So an index past the table never reads
    another sequence's page (tpu-inference's own gather clamps it to the table's last column
    instead). In the `base` form the end of a sequence is not known here: cut each row with
    `ragged_from_topk(rows, lengths)`, and `decode(..., check_indices=True)` catches rows outside
    the pool, not rows of a neighbouring sequence. For the per-token form, reshape the result to
    `[num_seqs * tokens, topk]` for `ragged_from_topk` (then one query token per sequence).
  """
  if local is None or not (hasattr(local, "shape") and hasattr(local, "dtype")):
    raise TypeError(f"local must be an array (jax or numpy); got {type(local).__name__}")
  if len(local.shape) not in (2, 3):
    raise ValueError(f"local must have shape [num_seqs, topk] or [num_seqs, tokens, topk]; got "
                     f"{tuple(local.shape)}")
  checks.check_array("local", local, ndim=len(local.shape), dtype=jnp.int32)
  if (page_table is None) == (base is None):
    raise ValueError("pool_rows takes exactly one of page_table (with page_size) and base; got "
                     f"{'both' if base is not None else 'neither'}")
  num_seqs = local.shape[0]
  local = jnp.asarray(local)
  # Broadcasts a per-sequence [num_seqs, ...] value against local's trailing dims.
  expand = (slice(None),) + (None,) * (local.ndim - 1)
  if base is not None:
    if page_size is not None:
      raise ValueError(f"page_size is only used with page_table; got page_size={page_size!r} "
                       "with base")
    checks.check_array("base", base, ndim=1, dtype=jnp.int32)
    if base.shape[0] != num_seqs:
      raise ValueError(f"base must have shape ({num_seqs},) (one per sequence); got "
                       f"{tuple(base.shape)}")
    rows = jnp.asarray(base)[expand] + local
    return jnp.where((local >= 0) & (rows >= 0), rows, -1)
  checks.check_array("page_table", page_table, ndim=2, dtype=jnp.int32)
  if page_table.shape[0] != num_seqs:
    raise ValueError(f"page_table must have shape ({num_seqs}, pages_per_seq) (one row per "
                     f"sequence); got {tuple(page_table.shape)}")
  if page_size is None:
    raise ValueError("page_table needs page_size (tokens per page, a static int)")
  checks.check_positive_int("page_size", page_size)
  page_size = int(page_size)
  pages_per_seq = page_table.shape[1]
  if pages_per_seq == 0:
    return jnp.full(local.shape, -1, jnp.int32)
  page = local // page_size
  used = (local >= 0) & (page < pages_per_seq)
  seq = jnp.arange(num_seqs, dtype=jnp.int32)[expand]
  physical = jnp.asarray(page_table)[seq, jnp.where(used, page, 0)]
  used &= physical >= 0
  return jnp.where(used, physical * page_size + local % page_size, -1)
