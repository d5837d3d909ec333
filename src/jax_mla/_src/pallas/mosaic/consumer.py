"""The Mosaic GPU decode kernel's consumer math (mosaic.kernel): the online softmax step with
the split's length mask, and the epilogue that writes a warpgroup's half of the output and the
lse."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jax_mla._src import layout
from jax_mla._src.jax_compat import mgpu_load
from jax_mla._src.kernel_math import LN2, LOG2E, SCORE_SCALE_LOG2, logaddexp2

BLOCK_ROWS = 64  # query rows per CTA: one wgmma M tile
BLOCK_KV = 64  # KV entries per step
HALF = layout.HEAD_DIM // 2  # output columns per consumer warpgroup
# Registers per thread slot of the kernels' launch (3 warpgroups, 65536 / 384 rounded down to
# 8: 168 each). `setmaxnreg` increases draw only on what the CTA's other warps released, so
# the three roles' counts must sum to no more than this, or the increase waits forever.
LAUNCH_REGISTERS = 3 * 168


def _plgpu():
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  return plgpu


def initial_state():
  """A consumer's (O [64, 256], m, l) before its first block: zeros, -inf, zeros."""
  plgpu = _plgpu()
  wgmma_layout = plgpu.Layout.WGMMA
  row_layout = wgmma_layout.reduce(1)
  return (plgpu.layout_cast(jnp.zeros((BLOCK_ROWS, HALF), jnp.float32), wgmma_layout),
          plgpu.layout_cast(jnp.full((BLOCK_ROWS,), -jnp.inf, jnp.float32), row_layout),
          plgpu.layout_cast(jnp.zeros((BLOCK_ROWS,), jnp.float32), row_layout))


def softmax_scores(s, base_entry, length, m_i, l_i, scale_log2=SCORE_SCALE_LOG2):
  """The online softmax step of scores s [64, block] (f32, WGMMA layout) of entries
  base_entry.. in the exp2 domain (s times scale_log2, kernel_math.score_scale_log2); entries
  at or past `length` are masked out. Returns (p, alpha, m, l), alpha [64] the factor O is
  rescaled by."""
  plgpu = _plgpu()
  col = plgpu.broadcasted_iota(jnp.int32, s.shape, 1, layout=plgpu.Layout.WGMMA)
  s = jnp.where(col + base_entry < length, s * scale_log2, -jnp.inf)
  m_new = jnp.maximum(m_i, s.max(axis=1))  # finite: every block has a valid entry
  alpha = jnp.exp2(m_i - m_new)
  p = jnp.exp2(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
  return p, alpha, m_new, l_i * alpha + p.sum(axis=1)


def rescale(acc, alpha):
  """O [64, 256] times the row factors alpha [64]."""
  return acc * lax.broadcast_in_dim(alpha, acc.shape, [0])


def write_results(acc, m_i, l_i, *, half, seq, row0, split, num_splits, sink_ref, out_ref,
                  lse_ref, stage_smem=None):
  """Output columns half * 256 .. + 255 of rows row0.. from this warpgroup's O [64, 256] and
  its m and l; half 0 also writes the lse. With one split: final bf16, sink and empty rows
  applied; with more: the softmax-normalized f32 partial and its lse for pallas.merge.

  stage_smem: a [64, 256] shared-memory tile this warpgroup may overwrite, of out_ref's dtype
  (bf16 with one split, f32 with more). The output goes through it and one TMA copy, instead
  of each thread storing its fragments of rows straight to global memory (4- or 8-byte
  stores, eight rows apart)."""
  plgpu = _plgpu()

  def store(value, at):
    if stage_smem is None:
      out_ref[at] = value
    else:
      stage_smem[...] = value
      plgpu.commit_smem()  # every thread's stores, before the TMA engine reads the tile
      plgpu.copy_smem_to_gmem(stage_smem, out_ref.at[at])
      plgpu.wait_smem_to_gmem(0)

  row_layout = plgpu.Layout.WGMMA.reduce(1)
  seen = l_i != 0  # NaN (a NaN scale in the row's data) counts as seen, so it propagates
  m_safe = jnp.where(seen, m_i, 0.0)
  lse2 = jnp.where(seen, m_safe + jnp.log2(jnp.where(seen, l_i, 1.0)), -jnp.inf)
  cols = pl.ds(half * HALF, HALF)
  rows = pl.ds(row0, BLOCK_ROWS)
  if num_splits == 1:
    sink = mgpu_load(sink_ref.at[rows], layout=row_layout, optimized=False)
    total2 = logaddexp2(lse2, sink * LOG2E)
    # out = acc * 2^(m - total): a +inf sink gives 0; empty rows are selected to 0.
    weight = jnp.where(seen, jnp.exp2(m_safe - total2), 0.0)
    store((acc * lax.broadcast_in_dim(weight, acc.shape, [0])).astype(out_ref.dtype),
          (seq, rows, cols))
    # An empty row's lse is the sink itself, not its round trip through log2 units.
    lse_at, lse = (seq, rows), jnp.where(seen, total2 * LN2, sink)
  else:
    inv_l = jnp.where(seen, 1.0 / jnp.where(seen, l_i, 1.0), 0.0)
    store(acc * lax.broadcast_in_dim(inv_l, acc.shape, [0]), (seq, split, rows, cols))
    lse_at, lse = (seq, split, rows), lse2 * LN2

  def write_lse():
    lse_ref[lse_at] = lse
  if isinstance(half, int):  # a warpgroup that knows its half statically
    if half == 0:
      write_lse()
  else:
    pl.when(half == 0)(write_lse)
