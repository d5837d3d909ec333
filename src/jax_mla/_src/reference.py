"""The pure-JAX reference decode: runs on any JAX backend, bounded memory, one executable per shape.

It walks each sequence's KV list in fixed-size chunks with an online softmax, so memory is
O(num_seqs * chunk * 512) whatever the lengths, and the number of chunks is a device value (a
`while_loop` up to the longest sequence): one compiled executable serves every set of lengths of
a shape, and nothing is read back to the host.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_mla._src import layout
from jax_mla._src.sources import KVSource

DEFAULT_CHUNK = 256


def reference_decode(queries, sources, sink, *, tokens_per_seq: int,
                     softmax_scale: float = layout.DEFAULT_SOFTMAX_SCALE,
                     chunk: int = DEFAULT_CHUNK):
  """Decode attention over one or more KV sources; arguments already validated.

  Args:
    queries: f32 `[T, H, 512]` query values (packed Q unpacked, or the model's Q).
    sources: `KVSource`s with shared lists (`[num_seqs + 1]`); the softmax runs over the union
      of their entries. A pool is packed rows or unquantized bf16/f32 rows (read as they are).
    sink: f32 `[H]`; `-inf` means no sink.
    softmax_scale: applied exactly, in f32.

  Returns:
    `(out bf16 [T, H, 512], lse f32 [T, H])`; lse is the natural log of the softmax denominator
    with the sink included. A sequence with no KV entries gives `out = 0`, `lse = sink`.
  """
  num_tokens, num_heads = queries.shape[:2]
  num_seqs = sources[0].kv_indptr.shape[0] - 1
  rows_per_seq = tokens_per_seq * num_heads
  # [B, msq * H, 512]: all tokens and heads of a sequence share its KV lists.
  queries = queries.astype(jnp.float32).reshape(num_seqs, rows_per_seq, layout.HEAD_DIM)
  sink_rows = jnp.tile(sink.astype(jnp.float32), tokens_per_seq)[None, :]  # [1, msq * H]

  def walk(source, state):
    """The online softmax over one source's lists, continuing from `state`."""
    starts = source.kv_indptr[:-1]
    lengths = jnp.maximum(source.kv_indptr[1:] - starts, 0)
    num_chunks = (jnp.max(lengths, initial=0) + chunk - 1) // chunk
    kv_indices = source.kv_indices
    # Gathers clamp their indices; an empty index list still needs one element to gather from.
    if kv_indices.shape[0] == 0:
      kv_indices = jnp.zeros((1,), jnp.int32)

    def body(c, state):
      m, l, acc = state
      offsets = c * chunk + jnp.arange(chunk, dtype=jnp.int32)
      valid = offsets[None, :] < lengths[:, None]  # [B, C]
      positions = jnp.clip(starts[:, None] + offsets[None, :], 0, kv_indices.shape[0] - 1)
      rows = jnp.clip(kv_indices[positions], 0, source.kv.shape[0] - 1)
      keys = _key_values(source, rows)  # [B, C, 512]
      # Select, not multiply: a masked entry may point at a row holding NaN.
      keys = jnp.where(valid[..., None], keys, 0.0)
      scores = jnp.einsum("bmd,bcd->bmc", queries, keys, precision=jax.lax.Precision.HIGHEST,
                          preferred_element_type=jnp.float32) * jnp.float32(softmax_scale)
      scores = jnp.where(valid[:, None, :], scores, -jnp.inf)
      m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
      m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
      alpha = jnp.exp(m - m_safe)  # 0 while nothing was seen (m = -inf)
      p = jnp.exp(scores - m_safe[..., None])
      l = l * alpha + jnp.sum(p, axis=-1)
      acc = acc * alpha[..., None] + jnp.einsum(
          "bmc,bcd->bmd", p, keys, precision=jax.lax.Precision.HIGHEST,
          preferred_element_type=jnp.float32)
      return m_new, l, acc

    return jax.lax.fori_loop(0, num_chunks, body, state), lengths > 0

  state = (jnp.full((num_seqs, rows_per_seq), -jnp.inf, jnp.float32),
           jnp.zeros((num_seqs, rows_per_seq), jnp.float32),
           jnp.zeros((num_seqs, rows_per_seq, layout.HEAD_DIM), jnp.float32))
  seen = jnp.zeros((num_seqs,), bool)
  for source in sources:
    state, has_entries = walk(source, state)
    seen = seen | has_entries
  m, l, acc = state

  # Whether the sequence has entries, not l > 0: a NaN in a used row makes l NaN, and the
  # sequence must come out NaN, not empty.
  seen = jnp.broadcast_to(seen[:, None], l.shape)
  m_safe = jnp.where(seen, m, 0.0)
  lse = jnp.logaddexp(jnp.where(seen, m_safe + jnp.log(jnp.where(seen, l, 1.0)), -jnp.inf),
                      sink_rows)
  # out = sum_n exp(s_n - lse) k_n = acc * exp(m - lse); a +inf sink gives exp(-inf) = 0.
  out = jnp.where(seen[..., None], acc * jnp.exp(m_safe - lse)[..., None], 0.0)
  out = out.reshape(num_tokens, num_heads, layout.HEAD_DIM).astype(jnp.bfloat16)
  return out, lse.reshape(num_tokens, num_heads)


def _key_values(source, rows):
  """f32 [..., 512] values of pool rows: packed rows dequantized, unquantized ones as they are."""
  if source.kv_rope is None:
    return source.kv[rows].astype(jnp.float32)
  return layout.unpack_rows(source.kv[rows], source.kv_rope[rows])


def decode(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, *, tokens_per_seq: int,
           num_kv_splits: int | None, return_lse: bool, softmax_scale: float | None = None,
           extra: KVSource | None = None):
  """The registry's `decode` entry; it takes every input form natively (bf16/f32 Q with
  q_rope=None, unquantized pools, `softmax_scale`, `extra`). The reference does not split
  (num_kv_splits is ignored)."""
  del num_kv_splits
  queries = q if q_rope is None else layout.unpack_rows(q, q_rope)
  sources = [KVSource(kv, kv_rope, kv_indptr, kv_indices)] + ([] if extra is None else [extra])
  out, lse = reference_decode(
      queries, sources, sink, tokens_per_seq=tokens_per_seq,
      softmax_scale=(layout.DEFAULT_SOFTMAX_SCALE if softmax_scale is None
                     else float(softmax_scale)))
  return out, (lse if return_lse else None)


def decode_persistent(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, workspace, *,
                      return_lse: bool):
  """The registry's `decode_persistent` entry: the same decode, one token per row; the workspace
  comes back untouched."""
  out, lse = decode(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, tokens_per_seq=1,
                    num_kv_splits=None, return_lse=return_lse)
  return out, lse, workspace
