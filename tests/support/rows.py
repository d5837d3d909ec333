"""Test data: packed rows made directly from random bytes, padding poison, ragged batches.

Rows are built from random fp8 and e8m0 bytes (never through the library's quantizer), so decode
tests do not depend on pack_rows being right.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

POISON_PATTERNS = ("zeros", "ff", "pattern", "random")


def random_packed(rng: np.random.Generator, shape, scale_exponents=(-6, -4)) -> np.ndarray:
  """uint8 [*shape, 512] rows of finite fp8 values, random per-tile scales, zero padding."""
  shape = tuple(shape)
  fp8 = rng.integers(0, 256, size=shape + (448,), dtype=np.uint8)
  fp8 = np.where((fp8 & 0x7F) == 0x7F, fp8 ^ 0x01, fp8)  # 0x7F / 0xFF are NaN in e4m3fn
  lo, hi = scale_exponents
  scales = (rng.integers(lo, hi + 1, size=shape + (7,)) + 127).astype(np.uint8)
  padding = np.zeros(shape + (50,), np.uint8)
  return np.concatenate([fp8, np.repeat(scales, 2, axis=-1), padding], axis=-1)


def random_rope(rng: np.random.Generator, shape, scale: float = 1.0) -> np.ndarray:
  return (rng.standard_normal(tuple(shape) + (64,)) * scale).astype(ml_dtypes.bfloat16)


def poison_padding(packed: np.ndarray, pattern: str, rng: np.random.Generator | None = None):
  """A copy of packed rows with bytes 462..511 overwritten by one of POISON_PATTERNS."""
  out = np.array(packed, copy=True)
  pad = out[..., 462:]
  if pattern == "zeros":
    pad[...] = 0x00
  elif pattern == "ff":
    pad[...] = 0xFF  # e8m0 NaN: a kernel that read these as scales would output NaN
  elif pattern == "pattern":
    pad[...] = (np.arange(50, dtype=np.uint32) * 37 + 11).astype(np.uint8)
  elif pattern == "random":
    rng = rng or np.random.default_rng(1234)
    pad[...] = rng.integers(0, 256, size=pad.shape, dtype=np.uint8)
  else:
    raise ValueError(f"unknown poison pattern {pattern!r}")
  return out


@dataclasses.dataclass
class Batch:
  """The arguments of jax_mla.decode as NumPy arrays."""
  q: np.ndarray
  q_rope: np.ndarray
  kv: np.ndarray
  kv_rope: np.ndarray
  kv_indptr: np.ndarray
  kv_indices: np.ndarray
  sink: np.ndarray | None
  tokens_per_seq: int

  def args(self):
    return (self.q, self.q_rope, self.kv, self.kv_rope, self.kv_indptr, self.kv_indices,
            self.sink)

  def sink_array(self) -> np.ndarray:
    """The sink as f32 [H] for the kernels that take no None: -inf means none."""
    if self.sink is None:
      return np.full(self.q.shape[1], -np.inf, np.float32)
    return np.asarray(self.sink, np.float32)

  def poison_unindexed_rows(self) -> None:
    """NaN scales (0xFF) in every pool row no sequence indexes, and the indices past the last
    sequence pointed at those rows: a kernel that lets a masked slot reach a sum goes NaN."""
    listed = int(self.kv_indptr[-1])
    used = np.zeros(self.kv.shape[0], bool)
    used[self.kv_indices[:listed]] = True
    self.kv[~used, 448:462] = 0xFF
    self.kv_indices[listed:] = np.flatnonzero(~used)[:len(self.kv_indices) - listed]


def make_batch(rng: np.random.Generator, *, num_heads: int, lengths, tokens_per_seq: int = 1,
               pool_rows: int = 512, sink=None, extra_indices: int = 0,
               index_pattern: str = "random") -> Batch:
  """A ragged decode batch: sequence b attends to `lengths[b]` rows of a pool of `pool_rows`.

  index_pattern: "random" (with repeats), "unique", "reversed", "same" (one row everywhere),
  "last" (the last row of the pool).
  extra_indices: trailing kv_indices entries past kv_indptr[-1] (must never be read).
  sink: None, a scalar (same for every head) or an [H] array.
  """
  lengths = np.asarray(lengths, np.int64)
  num_seqs = len(lengths)
  total = int(lengths.sum())
  if index_pattern == "random":
    indices = rng.integers(0, pool_rows, size=total)
  elif index_pattern == "unique":
    indices = rng.permutation(pool_rows)[:total] if total <= pool_rows else rng.integers(
        0, pool_rows, size=total)
  elif index_pattern == "reversed":
    indices = (pool_rows - 1 - np.arange(total)) % pool_rows
  elif index_pattern == "same":
    indices = np.full(total, rng.integers(0, pool_rows))
  elif index_pattern == "last":
    indices = np.full(total, pool_rows - 1)
  else:
    raise ValueError(index_pattern)
  indices = np.concatenate([indices, rng.integers(0, pool_rows, size=extra_indices)])
  num_tokens = num_seqs * tokens_per_seq
  if sink is not None and np.ndim(sink) == 0:
    sink = np.full(num_heads, sink, np.float32)
  return Batch(
      # Scales chosen so scores are O(1): softmaxes are neither uniform nor one-hot.
      q=random_packed(rng, (num_tokens, num_heads), scale_exponents=(-10, -8)),
      q_rope=random_rope(rng, (num_tokens, num_heads)),
      kv=random_packed(rng, (pool_rows,)),
      kv_rope=random_rope(rng, (pool_rows,)),
      kv_indptr=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
      kv_indices=indices.astype(np.int32),
      sink=None if sink is None else np.asarray(sink, np.float32),
      tokens_per_seq=tokens_per_seq,
  )


def equal_width_batches(rng: np.random.Generator, count: int, *, num_heads: int, lengths,
                        pool_rows: int, sink=None, extra: int = 2) -> list[Batch]:
  """`count` Batches whose kv_indices all have one length: element i uses
  `lengths[i % len(lengths)]`, and each index list is padded with junk entries (never read) to
  the longest list plus `extra`. Stacked, they make one vmapped or per-device sharded batch."""
  batches = [make_batch(rng, num_heads=num_heads, lengths=lengths[i % len(lengths)],
                        pool_rows=pool_rows, sink=sink) for i in range(count)]
  width = max(len(b.kv_indices) for b in batches) + extra
  for b in batches:
    junk = rng.integers(0, pool_rows, size=width - len(b.kv_indices)).astype(np.int32)
    b.kv_indices = np.concatenate([b.kv_indices, junk])
  return batches


def make_source(rng: np.random.Generator, lengths, *, pool_rows: int, form: str = "packed",
                extra_indices: int = 3):
  """A KV source as NumPy arrays `(kv, kv_rope, kv_indptr, kv_indices)` (jax_mla.KVSource's
  fields): list i holds `lengths[i]` random rows of a pool of `pool_rows`; form "packed" (random
  bytes, as make_batch's pools) or "bf16" (unquantized rows, kv_rope None, values that fp8 does
  not hold exactly). `extra_indices` junk entries follow the last list (never read)."""
  lengths = np.asarray(lengths, np.int64)
  indices = rng.integers(0, pool_rows, size=int(lengths.sum()) + extra_indices).astype(np.int32)
  indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
  if form == "packed":
    kv, kv_rope = random_packed(rng, (pool_rows,)), random_rope(rng, (pool_rows,))
  elif form == "bf16":
    kv, kv_rope = (rng.standard_normal((pool_rows, 512)) * 4).astype(ml_dtypes.bfloat16), None
  else:
    raise ValueError(form)
  return kv, kv_rope, indptr, indices
