"""What the public API does for a backend that lacks a capability, so that every backend serves
every input form. Each backend says which it takes natively (backends.Backend.native); the rest
is done here, on the device, with its cost stated:

  "float_q":       bf16/f32 Q is packed to fp8 rows (one quantization, as `pack_rows`).
  "softmax_scale": a scale other than the kernels' 1/sqrt(512) is folded into Q before packing:
                   Q * scale * sqrt(512). Exact when that factor is a power of two (only the
                   e8m0 tile scales change); otherwise packed Q is rounded once more (fp8 e4m3:
                   a relative error up to 2^-4 per value, like the packing itself).
  "float_kv":      a bf16/f32 pool is packed on the fly, only the rows its index list names
                   (a gather and a quantization of L rows, not of the pool).
  "extra":         one decode per source without the sink, then one merge of the two results
                   by their lse with the sink (`merge_by_lse`); each result is bf16, so the output
                   is rounded twice (within bf16's contracts: 2 ulps).

Per-query-token index lists need no backend support: the API runs them as one-token rows
(`per_token_source` expands a shared list to every token of its sequence).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_mla._src import layout, lse_merge
from jax_mla._src.sources import KVSource, is_packed

def is_kernel_scale(softmax_scale) -> bool:
  return softmax_scale is None or float(softmax_scale) == layout.DEFAULT_SOFTMAX_SCALE


def packed_query(q, q_rope, softmax_scale):
  """Q as packed rows with the softmax scale folded in (for kernels with the fixed scale):
  `(q uint8 [T, H, 512], q_rope bf16 [T, H, 64])`. Packed Q with the kernels' scale passes
  through untouched."""
  fold = not is_kernel_scale(softmax_scale)
  if q_rope is not None and not fold:
    return q, q_rope
  values = q.astype(jnp.float32) if q_rope is None else layout.unpack_rows(q, q_rope)
  if fold:
    values = values * jnp.float32(float(softmax_scale) / layout.DEFAULT_SOFTMAX_SCALE)
  return layout.pack_rows(values)


def packed_source(source: KVSource) -> KVSource:
  """A packed copy of the rows `source`'s index list names, with indices into that copy
  (`kv_indices[i]` becomes row i). Packed sources pass through."""
  if is_packed(source):
    return source
  indices = source.kv_indices
  if indices.shape[0] == 0:  # a pool needs a row; nothing will read it
    indices = jnp.zeros((1,), jnp.int32)
  # Clamped like the kernels clamp: an index outside the pool reads its nearest row.
  rows = jnp.clip(indices, 0, source.kv.shape[0] - 1)
  kv, kv_rope = layout.pack_rows(source.kv[rows])
  return KVSource(kv, kv_rope, source.kv_indptr, jnp.arange(indices.shape[0], dtype=jnp.int32))


def per_token_source(source: KVSource, tokens_per_seq: int) -> KVSource:
  """Shared lists ([num_seqs + 1]) repeated for every query token of their sequence
  ([num_seqs * tokens_per_seq + 1]); indices `tokens_per_seq` times as long. On the device,
  static shapes."""
  starts = source.kv_indptr[:-1]
  lengths = jnp.maximum(source.kv_indptr[1:] - starts, 0)
  num_seqs = lengths.shape[0]
  token_lengths = jnp.broadcast_to(lengths[:, None], (num_seqs, tokens_per_seq)).reshape(-1)
  indptr = jnp.concatenate([jnp.zeros((1,), jnp.int32),
                            jnp.cumsum(token_lengths, dtype=jnp.int32)])
  size = max(source.kv_indices.shape[0], 1) * tokens_per_seq
  positions = jnp.arange(size, dtype=jnp.int32)
  token = jnp.clip(jnp.searchsorted(indptr, positions, side="right") - 1, 0,
                   num_seqs * tokens_per_seq - 1).astype(jnp.int32)
  source_pos = starts[token // tokens_per_seq] + positions - indptr[token]
  indices = source.kv_indices
  if indices.shape[0] == 0:
    indices = jnp.zeros((1,), jnp.int32)
  indices = indices[jnp.clip(source_pos, 0, indices.shape[0] - 1)]
  return KVSource(source.kv, source.kv_rope, indptr, indices)


def merge_by_lse(results, sink):
  """One result from per-source results `[(out [T, H, 512], lse [T, H]), ...]` computed without
  the sink: the softmax over the union of their entries, with the sink f32 [H]. The weights and
  their contracts (those of a single decode) are `lse_merge.weights`'."""
  part_lse = jnp.stack([r[1] for r in results])  # [S, T, H]
  seen, shares, lse = lse_merge.weights(part_lse, sink.astype(jnp.float32), axis=0)
  # Added source by source, not stacked for lse_merge.merge's jnp.sum: the results arrive apart,
  # and XLA:CPU fuses the two forms differently (a rare element 1 bf16 ulp apart under jit).
  out = jnp.zeros(results[0][0].shape, jnp.float32)
  for (part, _), part_seen, share in zip(results, seen, shares):
    out = out + jnp.where(part_seen[..., None], part.astype(jnp.float32) * share[..., None], 0.0)
  return out.astype(jnp.bfloat16), lse[0]


def no_sink(num_heads: int) -> jax.Array:
  return jnp.full((num_heads,), -jnp.inf, jnp.float32)
