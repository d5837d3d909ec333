"""Element-wise pieces shared by the GPU kernels' bodies (Pallas Triton and Mosaic GPU): they
use only jnp/lax operations that both lowerings and interpret mode accept."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jax_mla._src import layout

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
# s = q.k / sqrt(512); the kernels work with s * log2(e) so they can use exp2.
SCORE_SCALE_LOG2 = LOG2E / math.sqrt(layout.HEAD_DIM)


def score_scale_log2(softmax_scale: float | None = None) -> float:
  """What the kernels multiply q.k by (f32 scores, in the exp2 domain): softmax_scale * log2(e),
  a Python float compiled into the kernel as a constant. None: 1 / sqrt(512)."""
  if softmax_scale is None:
    return SCORE_SCALE_LOG2
  return float(softmax_scale) * LOG2E


def e8m0_to_f32(b):
  """e8m0 byte values (any integer dtype) -> 2^(b - 127) in f32; 0xFF -> NaN. Built from bits:
  exact."""
  bits = jnp.left_shift(b.astype(jnp.int32), 23)
  x = jax.lax.bitcast_convert_type(bits, jnp.float32)
  x = jnp.where(b == 0, jnp.float32(2.0**-127), x)  # 2^-127 is an f32 subnormal: no exponent bits
  return jnp.where(b == 255, jnp.float32(jnp.nan), x)


def logaddexp2(a, b):
  """log2(2^a + 2^b) with infinities handled: (-inf, -inf) -> -inf, +inf wins."""
  mx = jnp.maximum(a, b)
  finite = jnp.abs(mx) < jnp.inf
  mx_safe = jnp.where(finite, mx, 0.0)
  return jnp.where(finite, mx_safe + jnp.log2(jnp.exp2(a - mx_safe) + jnp.exp2(b - mx_safe)), mx)


def split_chunks(start, end, split, num_splits: int, block: int):
  """A KV split's blocks of one sequence whose entries are start .. end - 1 of the index list:
  (length, first block, one past the last block). The blocks are divided as evenly as the
  count allows; a split past the end gets an empty range (first == last)."""
  length = jnp.maximum(end - start, 0)
  num_blocks = (length + block - 1) // block
  return (length, *split_blocks(num_blocks, split, num_splits))


def split_blocks(num_blocks, split, num_splits: int):
  """Split `split`'s share of blocks 0 .. num_blocks - 1: (first, one past the last)."""
  per_split = (num_blocks + num_splits - 1) // num_splits
  lo = jnp.minimum(split * per_split, num_blocks)
  return lo, jnp.minimum(lo + per_split, num_blocks)


def split_two_sources(indptr_a, indptr_b, seq, split, num_splits: int, block: int):
  """split_chunks for a sequence that reads two index lists (DeepSeek-V4's sliding window and
  compressed top-k): its blocks are source A's, then source B's (each list cut into blocks of
  its own, so no block spans both), divided among the splits as one list. Returns per source
  (start in its list, length, first block, one past the last block); either range may be
  empty."""
  sources = []
  for indptr in (indptr_a, indptr_b):
    start = indptr[seq]
    length = jnp.maximum(indptr[seq + 1] - start, 0)
    sources.append((start, length, (length + block - 1) // block))
  (start_a, length_a, blocks_a), (start_b, length_b, blocks_b) = sources
  lo, hi = split_blocks(blocks_a + blocks_b, split, num_splits)
  return ((start_a, length_a, jnp.minimum(lo, blocks_a), jnp.minimum(hi, blocks_a)),
          (start_b, length_b, jnp.maximum(lo, blocks_a) - blocks_a,
           jnp.maximum(hi, blocks_a) - blocks_a))
