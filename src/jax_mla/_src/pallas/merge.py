"""Merging the Pallas kernels' per-split partials: in jnp (XLA: two GPU passes up to 16 splits)
or as one Triton-lowered Pallas kernel (`merge_kernel`: one pass, each program reading every
split of a [rows, 128] tile at once).

Every split writes its partial (an empty split writes o = 0, lse = -inf). Both merges compute
`lse_merge.merge` (the weights and contracts shared with the API's merge of two KV sources): the
same expressions in the same order, over the split axis.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from jax_mla._src import lse_merge
from jax_mla._src.pallas import plan as pallas_plan


MERGES = ("auto", "xla", "kernel")
# merge="auto" takes the kernel from this many splits on. Measured on the H200 (2026-12-03,
# benchmarks/merge_bench.py, since removed, GPU busy time per merge): XLA's passes took 3.8 /
# 4.2 / 8.9 us for 8 / 16 / 32 splits of 128 rows (its reduction over the splits changes
# strategy past 16), the kernel 4.5 / 4.8 / 6.1; with more sequences XLA wins (1.8 against
# 7.9 us for 32 sequences of 2 splits).
KERNEL_MERGE_MIN_SPLITS = 32
# ... and with fewer splits where the partials hold at most this many real rows in all
# (sequences x tokens x heads): one launch that reads only the real rows, where XLA's merge is
# two fusions. H100, 2026-12-06 (benchmarks/README.md's choice table, merge_kernel_rows*_ab.json):
# 0.5-1.4 us less from 512 to 4096 rows (16.9 against 17.6 us at 16 x 4, B 32, K 512; 20.9
# against 22.2 at 128 heads, B 32, K 512), tied at 128 heads, B 8; unmeasured past 4096.
KERNEL_MERGE_MAX_ROWS = 4096
# merge_kernel's tile: 128 of the 512 columns, and as many rows as keep one program's load of
# every split at about 4096 elements (16 KB), so the splits' loads are issued together rather
# than one latency after another in a loop.
MERGE_COLS = 128
MERGE_ELEMENTS = 4096
MERGE_WARPS = 4


def merge_partials(parts, part_lse, sink_rows):
  """Combines split partials into the final result.

  Args:
    parts: f32 or bf16 [B, S, R, 512], each split's softmax-normalized output (0 where it saw
      nothing), merged in f32.
    part_lse: f32 [B, S, R], natural-log denominators without the sink (-inf: nothing seen).
    sink_rows: f32 [R], the sink logit of each row (-inf: none; +inf: the output is 0).

  Returns:
    (out bf16 [B, R, 512], lse f32 [B, R]), lse with the sink included.
  """
  # The weights from the lse slice by slice: on an sm90 GPU XLA then runs the merge as two
  # kernels up to 16 splits (the weights; the weighted sum and its division) where the reduce
  # and the shares took three (benchmarks/xla_kernels.py, jax 0.11.2 and 0.12; dropping one
  # such kernel took 13.84 to 13.1 us at 128 heads, B 1, K 512 on the H200, 2026-12-05).
  out, lse = lse_merge.merge(parts.astype(jnp.float32), part_lse, sink_rows[None, None, :],
                             axis=1, unroll=True)
  return out.astype(jnp.bfloat16), lse[:, 0]


def _merge_tile(parts_ref, lse_ref, sink_ref, out_ref, out_lse_ref, *, num_splits: int,
                padded_splits: int, block_rows: int, block_cols: int, heads: int):
  from jax.experimental.pallas import triton as plgpu  # pylint: disable=import-outside-toplevel
  seq, row_block, col_block = (pl.program_id(i) for i in range(3))
  splits = jnp.arange(padded_splits, dtype=jnp.int32)[:, None]
  rows = row_block * block_rows + jnp.arange(block_rows, dtype=jnp.int32)[None, :]
  cols = col_block * block_cols + jnp.arange(block_cols, dtype=jnp.int32)
  real = jnp.broadcast_to(splits < num_splits, (padded_splits, block_rows))
  # The splits past num_splits (padding to a power of 2) load as never seen. The partials'
  # load comes first, so the weights' arithmetic can run while it is in flight.
  parts = plgpu.load(parts_ref.at[seq, splits[:, :, None], rows[:, :, None], cols[None, None, :]],
                     mask=jnp.broadcast_to(real[:, :, None], (*real.shape, block_cols)),
                     other=0.0).astype(jnp.float32)
  part_lse = plgpu.load(lse_ref.at[seq, splits, rows], mask=real, other=-jnp.inf)
  # Row r is head r % heads of its token: the sink by head, so no XLA pass lays it out by row.
  sink = plgpu.load(sink_ref.at[rows[0] % heads])
  out, lse = lse_merge.merge(parts, part_lse, sink[None, :], axis=0)
  out_ref[seq, pl.ds(row_block * block_rows, block_rows),
          pl.ds(col_block * block_cols, block_cols)] = out.astype(out_ref.dtype)

  @pl.when(col_block == 0)
  def _():
    out_lse_ref[seq, pl.ds(row_block * block_rows, block_rows)] = lse[0]


def merge_kernel(parts, part_lse, sink, *, rows: int | None = None, heads: int | None = None,
                 interpret: bool = False, block_cols: int = MERGE_COLS,
                 elements: int | None = None, num_warps: int | None = None):
  """merge_partials as one Pallas kernel (Triton-lowered; interpret mode on any backend), of
  the first `rows` rows of the partials (default: all; the rest are the decode kernels'
  padding), row r taking sink[r % heads] (default heads: one sink per row, sink_rows's).

  A program per (sequence, tile of rows, 128 columns) loads every split of its tile together;
  `rows` must be a multiple of 16. elements and num_warps default to MERGE_ELEMENTS and
  MERGE_WARPS, read at the call so an A/B (benchmarks/mosaic_ab.py) can set them."""
  elements = MERGE_ELEMENTS if elements is None else elements
  num_warps = MERGE_WARPS if num_warps is None else num_warps
  num_seqs, num_splits, num_rows, head_dim = parts.shape
  rows = num_rows if rows is None else rows
  heads = num_rows if heads is None else heads
  if head_dim % block_cols or rows % 16 or not 0 < rows <= num_rows:
    raise ValueError(f"merge_kernel needs rows a multiple of 16, at most the partials', and "
                     f"columns of {block_cols}, got rows {rows} of parts {parts.shape}")
  if sink.shape != (heads,):
    raise ValueError(f"merge_kernel needs a sink per head, [{heads}], got {sink.shape}")
  padded_splits = pl.next_power_of_2(num_splits)
  block_rows = max(1, min(16, elements // (padded_splits * block_cols)))
  kernel = functools.partial(_merge_tile, num_splits=num_splits, padded_splits=padded_splits,
                             block_rows=block_rows, block_cols=block_cols, heads=heads)
  extra = {}
  if not interpret:
    from jax.experimental.pallas import triton as plgpu  # pylint: disable=import-outside-toplevel
    extra["compiler_params"] = plgpu.CompilerParams(num_warps=num_warps, num_stages=1)
  return pl.pallas_call(
      kernel, grid=(num_seqs, rows // block_rows, head_dim // block_cols),
      out_shape=(jax.ShapeDtypeStruct((num_seqs, rows, head_dim), jnp.bfloat16),
                 jax.ShapeDtypeStruct((num_seqs, rows), jnp.float32)),
      interpret=interpret, name="jax_mla_merge_partials", **extra,
  )(parts, part_lse, sink.astype(jnp.float32))


def finish(results, num_splits, sink, *, rows, num_tokens, num_heads, merge: str = "xla",
           interpret: bool = False):
  """The kernel's results (final, or partials when num_splits > 1, then merged here by
  `merge`: "xla" (merge_partials), "kernel" (merge_kernel) or "auto" (the kernel from
  KERNEL_MERGE_MIN_SPLITS splits on, or for at most KERNEL_MERGE_MAX_ROWS real rows)) as
  (out bf16 [T, H, 512], lse f32 [T, H]), padding rows dropped. sink: [H] (either merge takes
  it as f32); `rows` real rows per sequence (tokens x heads) lead the results' padded rows."""
  if merge not in MERGES:
    raise ValueError(f"merge must be one of {MERGES}, got {merge!r}")
  if merge == "auto" and num_splits > 1:
    num_seqs = results[0].shape[0]
    few_rows = num_seqs * rows <= KERNEL_MERGE_MAX_ROWS
    merge = ("kernel" if (num_splits >= KERNEL_MERGE_MIN_SPLITS or few_rows) and rows % 16 == 0
             else "xla")
  if num_splits == 1:
    out, lse = results
  elif merge == "kernel":
    out, lse = merge_kernel(*results, sink, rows=rows, heads=num_heads, interpret=interpret)
  else:
    parts, part_lse = results
    # The partials may hold only the real rows of a row block whose lse has its padding.
    sink_rows = pallas_plan.sink_rows(sink, rows // num_heads, parts.shape[2])
    out, lse = merge_partials(parts, part_lse[:, :, :parts.shape[2]], sink_rows)
  out = out[:, :rows]
  return (out.reshape(num_tokens, num_heads, out.shape[-1]),
          lse[:, :rows].reshape(num_tokens, num_heads))
