"""A KV source: one pool of rows and the index lists into it.

DeepSeek-V4 attends per step to two pools (the sliding-window cache and the compressed cache
through the indexer's top-k); `jax_mla.decode` takes the first as its positional arguments and
the second as `extra=KVSource(...)`. A pool is either packed fp8 rows (`pack_rows`: uint8
[R, 512] + bf16 RoPE [R, 64]) or unquantized rows (bf16 or f32 [R, 512], `kv_rope=None`), as
servers keep the window and the heavily compressed caches.

Index lists are ragged (`kv_indptr`, `kv_indices`, page size 1) and come in two forms, told
apart by the length of `kv_indptr`:
  shared:    [num_seqs + 1]: the query tokens of a sequence share one list;
  per token: [num_seqs * tokens_per_seq + 1]: each query token has its own (MTP, where V4 gives
             each token its own top-k).
With one token per sequence the two are the same.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jax_mla._src import checks, kv_cache, layout



class KVSource(NamedTuple):
  """One KV pool and its index lists (a pytree: pass it through `jit` like any array tuple).

  kv: uint8 `[R, 512]` packed rows with `kv_rope` bf16 `[R, 64]`, or bf16/f32 `[R, 512]`
    unquantized rows with `kv_rope=None`.
  kv_indptr: int32 `[num_seqs + 1]` (shared lists) or `[num_seqs * tokens_per_seq + 1]` (a list
    per query token); list i is `kv_indices[kv_indptr[i]:kv_indptr[i + 1]]`, pool rows.
  kv_indices: int32 `[L]`; entries past `kv_indptr[-1]` are never read.
  """
  kv: jax.Array
  kv_rope: jax.Array | None
  kv_indptr: jax.Array
  kv_indices: jax.Array

  @classmethod
  def from_topk(cls, kv, kv_rope, indices, lengths=None) -> "KVSource":
    """A source from fixed-width index buffers (FlashMLA's and tpu-inference's layout).

    Args:
      indices: int32 `[num_seqs, topk]` (shared by a sequence's tokens) or
        `[num_seqs, tokens_per_seq, topk]` (a list per query token) pool rows; negative entries
        are unused. Sequence-local indices become pool rows with `jax_mla.pool_rows` first.
      lengths: optional int32 `[num_seqs]` (or `[num_seqs, tokens_per_seq]` with 3-D indices);
        entries at or past a list's length are unused too.
    """
    if not hasattr(indices, "ndim") or indices.ndim not in (2, 3):
      raise ValueError(f"indices must have shape [num_seqs, topk] or [num_seqs, tokens_per_seq, "
                       f"topk]; got {getattr(indices, 'shape', type(indices).__name__)}")
    if indices.ndim == 3:
      num_seqs, tokens, topk = indices.shape
      if lengths is not None and getattr(lengths, "ndim", None) == 1:
        checks.check_array("lengths", lengths, ndim=1, dtype=jnp.int32)
        if lengths.shape[0] != num_seqs:
          raise ValueError(f"lengths must have shape ({num_seqs},) or ({num_seqs}, {tokens}); "
                           f"got {tuple(lengths.shape)}")
        lengths = jnp.broadcast_to(lengths[:, None], (num_seqs, tokens))
      indices = indices.reshape(num_seqs * tokens, topk)
      lengths = None if lengths is None else lengths.reshape(num_seqs * tokens)
    kv_indptr, kv_indices = kv_cache.ragged_from_topk(indices, lengths)
    return cls(kv, kv_rope, kv_indptr, kv_indices)


def is_packed(source: KVSource) -> bool:
  return jnp.dtype(source.kv.dtype) == jnp.dtype(jnp.uint8)


def check_source(name: str, source: KVSource, *, num_seqs: int, tokens_per_seq: int) -> bool:
  """Checks a source's arrays (error messages name `name`'s fields as the user passed them);
  returns whether its lists are per query token."""
  kv, kv_rope = source.kv, source.kv_rope
  if not (hasattr(kv, "shape") and hasattr(kv, "dtype")):
    raise TypeError(f"{name.format('kv')} must be an array (jax or numpy); got "
                    f"{type(kv).__name__}")
  if jnp.dtype(kv.dtype) == jnp.dtype(jnp.uint8):
    checks.check_array(name.format("kv"), kv, ndim=2, dtype=jnp.uint8, last=layout.ROW_BYTES)
    if kv_rope is None:
      raise ValueError(f"{name.format('kv_rope')} is required with packed uint8 rows "
                       f"{name.format('kv')} (kv_rope=None is for unquantized bf16/f32 rows)")
    checks.check_array(name.format("kv_rope"), kv_rope, ndim=2, dtype=jnp.bfloat16,
                       last=layout.ROPE_DIM)
    if kv_rope.shape[0] != kv.shape[0]:
      raise ValueError(f"{name.format('kv_rope')} must have shape ({kv.shape[0]}, "
                       f"{layout.ROPE_DIM}) ({name.format('kv')} is {tuple(kv.shape)}); got "
                       f"{tuple(kv_rope.shape)}")
  elif jnp.dtype(kv.dtype) in checks.FLOAT_DTYPES:
    checks.check_array(name.format("kv"), kv, ndim=2, dtype=kv.dtype, last=layout.HEAD_DIM)
    if kv_rope is not None:
      raise ValueError(f"{name.format('kv')} holds unquantized {kv.dtype} rows with their RoPE "
                       f"in dims 448..511; pass {name.format('kv_rope')}=None")
  else:
    raise TypeError(f"{name.format('kv')} must be uint8 packed rows or bf16/f32 rows; got "
                    f"{jnp.dtype(kv.dtype)}")
  if kv.shape[0] < 1:
    raise ValueError(f"{name.format('kv')} must hold at least one row; got shape "
                     f"{tuple(kv.shape)}")
  checks.check_array(name.format("kv_indptr"), source.kv_indptr, ndim=1, dtype=jnp.int32)
  checks.check_array(name.format("kv_indices"), source.kv_indices, ndim=1, dtype=jnp.int32)
  lists = source.kv_indptr.shape[0] - 1
  num_tokens = num_seqs * tokens_per_seq
  if lists not in (num_seqs, num_tokens):
    forms = (f"num_seqs + 1 = {num_seqs + 1} (shared lists)" if tokens_per_seq == 1 else
             f"num_seqs + 1 = {num_seqs + 1} (shared lists) or num_seqs * tokens_per_seq + 1 = "
             f"{num_tokens + 1} (a list per query token)")
    raise ValueError(f"{name.format('kv_indptr')} must have {forms} entries, with num_seqs = "
                     f"len(q) / tokens_per_seq = {num_seqs}; got shape "
                     f"{tuple(source.kv_indptr.shape)}")
  return tokens_per_seq > 1 and lists == num_tokens
