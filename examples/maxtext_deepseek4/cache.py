"""The decode caches of a DeepSeek-V4 attention layer in jax_mla's layout, and the two index lists
of a step. No MaxText here: decoder.py builds on it, and h200_real_shape.py runs it without MaxText.

Per sequence b of a batch:
  window pool:     a ring of S >= W rows, token at position k in row `b * S + k % S`;
  compressed pool: C rows, block c (tokens c*r .. c*r + r - 1) in row `b * C + c`.
Either pool holds packed fp8 rows (uint8 [R, 512] + bf16 RoPE [R, 64], written by
`jax_mla.update_cache`) or unquantized bf16 rows ([R, 512], RoPE in dims 448..511). A step writes
one row per new token (and per completed block): no pool is copied.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import jax_mla

HEAD_DIM = 512
ROPE_DIM = 64
KV_FORMATS = ("fp8", "bf16")


def empty_pool(rows: int, kv_format: str):
  """(kv, kv_rope) of `rows` zero rows: uint8 [rows, 512] + bf16 [rows, 64] (fp8) or
  bf16 [rows, 512] + None."""
  if kv_format not in KV_FORMATS:
    raise ValueError(f"kv_format must be one of {KV_FORMATS}; got {kv_format!r}")
  if kv_format == "fp8":
    return jnp.zeros((rows, HEAD_DIM), jnp.uint8), jnp.zeros((rows, ROPE_DIM), jnp.bfloat16)
  return jnp.zeros((rows, HEAD_DIM), jnp.bfloat16), None


def write_rows(kv, kv_rope, x, slots):
  """Writes rows x [..., 512] at pool rows `slots` [...] (negative: skipped)."""
  x = x.reshape(-1, HEAD_DIM)
  slots = slots.reshape(-1).astype(jnp.int32)
  if kv_rope is not None:
    return jax_mla.update_cache(kv, kv_rope, x.astype(jnp.float32), slots)
  rows = jnp.where(slots < 0, kv.shape[0], slots)
  return kv.at[rows].set(x.astype(kv.dtype), mode="drop"), None


def pool_rows(local, rows_per_seq: int):
  """Sequence-local rows [B, n] (-1 unused) -> pool rows, each sequence's from b * rows_per_seq
  (`jax_mla.pool_rows` with a per-sequence base)."""
  base = jnp.arange(local.shape[0], dtype=jnp.int32) * rows_per_seq
  return jax_mla.pool_rows(local.astype(jnp.int32), base=base)


def window_source(kv, kv_rope, positions, *, window: int, slots: int) -> jax_mla.KVSource:
  """The window of query positions [B] (or [B, 1]): positions p - W + 1 .. p that are >= 0, newest
  first, as rows of the ring."""
  positions = positions.reshape(-1, 1).astype(jnp.int32)
  key_pos = positions - jnp.arange(window, dtype=jnp.int32)[None, :]
  local = jnp.where(key_pos >= 0, key_pos % slots, -1)
  return jax_mla.KVSource.from_topk(kv, kv_rope, pool_rows(local, slots))


def all_blocks(num_blocks, rows_per_seq: int):
  """Local block ids [B, C]: every completed block (HCA), -1 past `num_blocks` [B]."""
  blocks = jnp.arange(rows_per_seq, dtype=jnp.int32)[None, :]
  return jnp.where(blocks < num_blocks[:, None], blocks, -1)


def topk_blocks(scores, num_blocks, topk: int):
  """Local block ids [B, min(topk, C)]: the top-k scores [B, C] among completed blocks (CSA's
  indexer), -1 where fewer are completed."""
  valid = jnp.arange(scores.shape[1])[None, :] < num_blocks[:, None]
  scores = jnp.where(valid, scores, -jnp.inf)
  top = jax.lax.top_k(scores, min(topk, scores.shape[1]))[1].astype(jnp.int32)
  return jnp.where(jnp.take_along_axis(valid, top, axis=1), top, -1)


def compressed_source(kv, kv_rope, local, rows_per_seq: int) -> jax_mla.KVSource:
  return jax_mla.KVSource.from_topk(kv, kv_rope, pool_rows(local, rows_per_seq))


def attend(q, sink, window: jax_mla.KVSource, extra: jax_mla.KVSource | None, *,
           softmax_scale: float = 1.0, backend: str = "auto"):
  """jax_mla.decode over both sources: q [B, H, 512] (bf16/f32) -> out bf16 [B, H, 512]."""
  out, _ = jax_mla.decode(q, None, window.kv, window.kv_rope, window.kv_indptr,
                          window.kv_indices, sink, extra=extra, softmax_scale=softmax_scale,
                          backend=backend, return_lse=False)
  return out
