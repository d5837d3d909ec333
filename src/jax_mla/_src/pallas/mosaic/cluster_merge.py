"""The split merge inside the Mosaic kernel, through distributed shared memory: a sequence's
splits run as one cluster (mosaic.decode.CLUSTER_MERGE_SPLITS, unpaired CTAs), each consumer
warpgroup publishes its softmax-normalized bf16 partial in its own half of Q's tile (where the
one-split epilogue stages its output too) and warpgroup 0 the rows' lse, the cluster syncs,
and each CTA merges a 1 / S share of the columns from every CTA's partials and writes the
final output and lse. No partials in global memory and no merge launch after the kernel:
H100, 2026-12-06, 16 x 4 B 64 K 512, the kernel 21.8 us against the kernel 20.4 plus
pallas.merge's 3.8 (benchmarks/README.md has the A/B; the comment on CLUSTER_MERGE_SPLITS,
why 4 splits do not take it).

The merge is lse_merge's contract (a part that saw nothing contributes nothing; NaN
propagates; a +inf sink gives 0 and lse +inf; a row no split saw gives 0 and lse = its sink)
and its weights (lse_merge.terms, over a list of the splits' lse) in the kernel's log2 units,
on the same bf16 partials pallas.merge would read.

Lifetime: a CTA's partial and lse are read by its peers between the cluster barrier after
they are written and the one every thread passes at the kernel's end (mosaic.pair's
cluster_sync), so no CTA exits while a peer may still read its shared memory.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jax_mla._src import lse_merge
from jax_mla._src.jax_compat import mgpu_load
from jax_mla._src.kernel_math import LOG2E
from jax_mla._src.pallas.mosaic import consumer as mosaic_consumer
from jax_mla._src.pallas.mosaic import pair as mosaic_pair
from jax_mla._src.pallas.mosaic.gather import SWIZZLE_BYTES, TILE_COLS, k_tile_transforms

BLOCK_ROWS = mosaic_consumer.BLOCK_ROWS
HALF = mosaic_consumer.HALF
# Columns a warpgroup merges and writes at a time (through its out tile and a TMA copy): its
# share of a half is HALF / splits, two such chunks at 2 splits.
CHUNK_COLS = 64


def _plgpu():
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  return plgpu


def scratch_types():
  """The merge's shared memory: warpgroup 0's rows' lse (read by the peers) and each
  warpgroup's out tile of CHUNK_COLS columns (16 KB)."""
  plgpu = _plgpu()
  return dict(lse_smem=plgpu.SMEM((BLOCK_ROWS,), jnp.float32),
              out_smem=plgpu.SMEM((2, BLOCK_ROWS, CHUNK_COLS), jnp.bfloat16,
                                  transforms=k_tile_transforms()))


def peer_columns(stage_ref, peer, col0, cols: int):
  """bf16 [64, cols] in the WGMMA layout: columns col0 .. col0 + cols - 1 (col0 a multiple of
  TILE_COLS, a device value) of the [64, 256] tiled and swizzled tile stage_ref in the shared
  memory of the cluster's CTA `peer` (a Python int).

  Written here rather than as Pallas's cluster_ref of a column slice, which jax 0.11's Mosaic
  GPU does not lower (the slice's offset is dropped from the peer ref's type)."""
  plgpu = _plgpu()
  scalar = plgpu.Layout.WG_SPLAT(shape=())

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(k_tile_transforms()), scalar),
                     return_type=plgpu.ShapeDtypeStruct((BLOCK_ROWS, cols), jnp.bfloat16,
                                                        layout=plgpu.Layout.WGMMA))
  def load(ctx, stage, first_col):
    del ctx
    # pylint: disable=import-outside-toplevel
    from jax.experimental.mosaic import gpu as mgpu
    from jax.experimental.mosaic.gpu import utils as mgpu_utils
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import arith
    i8, i32 = ir.IntegerType.get_signless(8), ir.IntegerType.get_signless(32)
    stage_type = ir.MemRefType(stage.type)
    row_tiles, col_tiles, tile_rows, tile_cols = stage_type.shape
    strides, _ = stage_type.get_strides_and_offset()
    if (tile_rows, tile_cols) != (8, TILE_COLS) or cols % TILE_COLS:
      raise ValueError(f"peer_columns needs (8, {TILE_COLS}) tiles and whole ones, got "
                       f"{stage_type} and {cols} columns")
    # A column tile is strides[1] elements on from the one before it, in every row tile.
    tile_bytes = strides[1] * 2
    first = arith.muli(arith.divui(first_col.registers.flat[0], mgpu_utils.c(TILE_COLS, i32)),
                       mgpu_utils.c(tile_bytes, i32))
    local = mgpu_utils.getelementptr(mgpu_utils.memref_ptr(stage), [first], i8)
    remote = mgpu_utils.get_cluster_ptr(local, mgpu_utils.c(peer, i32), generic=False)
    layout = ir.StridedLayoutAttr.get(0, strides)
    remote_type = ir.MemRefType.get((row_tiles, cols // TILE_COLS, tile_rows, tile_cols),
                                    stage_type.element_type, layout,
                                    ir.IntegerAttr.get(i32, 7))
    return mgpu.FragmentedArray.load_tiled(mgpu_utils.ptr_as_memref(remote, remote_type),
                                           swizzle=SWIZZLE_BYTES, layout=mgpu.WGMMA_LAYOUT)

  return load(stage_ref, col0)


def write_merged(acc, m_i, l_i, *, half: int, seq, row0, rank, num_splits: int, sink_ref,
                 out_ref, lse_ref, heads: int, stage_smem, lse_smem, out_smem):
  """A consumer warpgroup's epilogue in a cluster of the sequence's num_splits splits: its
  partial O [64, 256] (columns half * 256 ..) with m and l published, then the final bf16
  output of columns half * 256 + rank * 256 / num_splits .. (+ 256 / num_splits) of rows
  row0.. merged from every split's, and (rank 0, warpgroup 0) the final lse [64].

  stage_smem: this warpgroup's half of Q's tile [64, 256] (which the peers read);
  lse_smem [64] f32; out_smem: this warpgroup's [64, CHUNK_COLS] out tile."""
  plgpu = _plgpu()
  row_layout = plgpu.Layout.WGMMA.reduce(1)
  cols = HALF // num_splits
  if cols % CHUNK_COLS and CHUNK_COLS % cols:
    raise ValueError(f"the cluster merge needs {HALF} / splits columns in chunks of "
                     f"{CHUNK_COLS}, got {num_splits} splits")
  chunk_cols = min(cols, CHUNK_COLS)

  seen, _, lse2 = mosaic_consumer.rows_lse2(m_i, l_i)
  # The partial as pallas.merge would read it from global memory: normalized, in bf16.
  stage_smem[...] = mosaic_consumer.normalized(acc, l_i, seen).astype(jnp.bfloat16)
  if half == 0:
    lse_smem[...] = lse2
  mosaic_pair.cluster_sync()  # every split's partial and lse are published

  split_lse2 = [mgpu_load(plgpu.cluster_ref(lse_smem, {"split": s}), layout=row_layout,
                          optimized=False) for s in range(num_splits)]
  t = lse_merge.terms(split_lse2, functools.reduce, exp=jnp.exp2, log=jnp.log2)
  sink = mosaic_consumer.row_sinks(sink_ref, row0, heads)
  sink2 = sink * LOG2E
  # Rows no split saw (total 0) are 0 whatever the denominator; a +inf sink makes it +inf and
  # the row 0.
  denom = t.total + jnp.exp2(sink2 - t.mx)
  scale = jnp.where(t.total != 0, 1.0 / denom, 0.0)

  valid = min(out_ref.shape[1], BLOCK_ROWS)
  for chunk in range(cols // chunk_cols):
    col0 = rank * cols + chunk * chunk_cols
    shape = (BLOCK_ROWS, chunk_cols)
    out = None
    for s in range(num_splits):
      part = peer_columns(stage_smem, s, col0, chunk_cols).astype(jnp.float32)
      # Selected, not multiplied: an unseen split's partial adds nothing, even a NaN.
      term = jnp.where(lax.broadcast_in_dim(t.seen[s], shape, [0]),
                       part * lax.broadcast_in_dim(t.terms[s], shape, [0]), 0.0)
      out = term if out is None else out + term
    out = out * lax.broadcast_in_dim(scale, shape, [0])
    if chunk:  # the previous chunk's copy has read the tile
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)
    out_smem[...] = out.astype(out_ref.dtype)
    plgpu.commit_smem()  # every thread's stores, before the TMA engine reads the tile
    tile = out_smem if valid == BLOCK_ROWS else out_smem.at[pl.ds(0, valid)]
    plgpu.copy_smem_to_gmem(tile, out_ref.at[seq, pl.ds(row0, valid),
                                             pl.ds(half * HALF + col0, chunk_cols)])
  plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  if half == 0:
    _, lse = mosaic_consumer.lse_with_sink(t.any_seen, t.lse_kv, sink)

    @pl.when(rank == 0)
    def _():
      lse_ref[seq, pl.ds(row0, BLOCK_ROWS)] = lse
