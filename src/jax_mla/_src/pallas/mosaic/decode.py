"""The fp8 MLA decode as a Pallas Mosaic GPU kernel (NVIDIA Hopper: wgmma, TMA, warpgroups).

`jax_mla.decode(..., backend="pallas")` (and "auto" on a GPU) runs it on sm90 GPUs
(pallas_backend); it lowers on any machine (checked in CI) and passes the oracle tests on an
H200; benchmarks/README.md has its speed.

One CTA per (sequence, block of 64 query rows, KV split) with three warpgroups: the kernel is
mosaic_direct's (the producer gathers and dequantizes rows from global memory itself,
mosaic_gather, into two K tiles; the consumers run QK, the online softmax with the sink and
PV on the tensor cores). This module holds its configuration, the split plan and the call.
(Until 2026-12-03 it also held a first, "staged" design, in which the producer bulk-copied the
raw rows into shared memory and both consumers dequantized them: 13-22% slower, removed; its
measurements are in the notes and its code in the history.)

With one split the kernel finalizes (sink, empty rows) and writes bf16 out and lse; with more it
writes softmax-normalized f32 partials and their lse, merged by `pallas_merge` (MosaicConfig.merge).
Lengths and indices are device values: one executable serves every set of lengths.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp

from jax_mla._src import layout
from jax_mla._src.pallas.mosaic import kernel as mosaic_direct
from jax_mla._src.pallas import merge as pallas_merge
from jax_mla._src.pallas import plan as pallas_plan
from jax_mla._src.pallas.mosaic.consumer import BLOCK_KV, BLOCK_ROWS, LAUNCH_REGISTERS


@dataclasses.dataclass(frozen=True)
class MosaicConfig:
  """The kernel's choices (mosaic_direct's design). The defaults are the fastest measured;
  the other values are kept to measure against
  (benchmarks/gpu_decode.py's MOSAIC_IMPLS)."""
  # The direct design reads the packed fp8 Q and the raw index list itself: no XLA passes
  # before the kernel (Q's dequantization and padding, the indices' padding and clamping).
  # Measured as GPU busy time per call (gpu_decode.py --timing profiler; H200, 2026-12-03,
  # 128 heads) it was faster at every shape: 39.5 against 46.4 us at B 64, K 512; 76.2
  # against 88.3 at B 128, K 512; 216.9 against 229.6 at B 128, K 2048; 14.6 against 15.4 at
  # B 1, K 512 (the XLA passes took 5.8-10.5 us at B 64-128). (Host-clock loops had hidden
  # that behind the loop's own gaps.)
  inputs_in_kernel: bool = True
  # The direct design pairs the CTAs of row blocks 2j and 2j + 1 (128 heads: both blocks of a
  # sequence) in a cluster, and each gathers and dequantizes half of every KV block into both
  # (mosaic_pair). Without it both gather every row. Ignored when the row blocks are odd in
  # number. None: on. On the H200 (2026-12-03, 128 heads, K 2048) with "p_exchange": 246.8
  # against 277.0 us at B 128, 136.4 against 150.3 at B 64; with "s_exchange" and an earlier
  # register split it was slower (352.6 against 330.1 at B 128).
  pair_row_blocks: bool | None = None
  # The direct design's registers per thread of warpgroups 0, 1 and 2 after `setmaxnreg`
  # (multiples of 8 in 24..256, summing to at most LAUNCH_REGISTERS); None: mosaic_direct's
  # REGISTERS.
  direct_registers: tuple[int, int, int] | None = None
  # The shortest split the planner makes to fill the GPU when there are few (sequence, row
  # block) programs. 64 against 256 on the H200 (2026-12-02, 128 heads, B 1): 34.6 against
  # 52.4 us at K 2048, 27.9 against 44.2 at K 512. (Under the "fill" rule it cost 85 against
  # 70 us at 64 heads, B 64, K 512: 3 splits, two waves; "waves" makes 2 there, 52 us.)
  min_split_entries: int = 64
  # The planner's rule for the split count (pallas_plan.SPLIT_RULES). "waves" avoids a second,
  # part-empty wave of CTAs; on the H200 (2026-12-03) it was faster than "fill" at every
  # measured shape where the two plans differ, e.g. 126 against 166 us (64 heads, B 64, K 2048:
  # 2 splits against 3) and 220 against 228 (128 heads, B 64, K 2048: 1 against 2).
  split_rule: str = "waves"
  # approx_math: the softmax's exp2 and the lse's log2 use the hardware approximations
  # (ex2.approx, lg2.approx: relative error about 2^-22, far below bf16's). 3% faster on the
  # H200 (2026-12-02, B 128, K 2048: 419 us against 433, the same build otherwise).
  approx_math: bool = True
  # How several splits' partials are merged (pallas_merge.MERGES): "xla" (merge_partials's
  # jnp: XLA's passes), "kernel" (merge_kernel: one Pallas pass) or "auto" (the kernel from
  # pallas_merge.KERNEL_MERGE_MIN_SPLITS splits on, where XLA's reduction over the splits is
  # slow). GPU busy time per call on the H200 (2026-12-03), the whole decode, XLA's merge
  # against the kernel: at batch 1, K 2048 (32 splits) 20.1 against 17.3 us (128 heads), 17.5
  # against 15.5 (64), 19.0 against 16.2 (16 x 4); at K 512 and 1024 (8 and 16 splits) within
  # 0.5 us either way; at batch 8 and 32 the kernel lost 1.4-7 us (benchmarks/merge_bench.py:
  # XLA merges 16.8 MB of L2-resident partials in 1.8 us, the kernel in 7.9).
  merge: str = "auto"


def _plgpu():
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  return plgpu


def mosaic_decode(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, *, tokens_per_seq: int,
                  num_kv_splits_: int | None = None, return_lse: bool = True,
                  config: MosaicConfig | None = None):
  """Decode with the Mosaic GPU kernel; arguments as `pallas_decode.pallas_decode`."""
  plgpu = _plgpu()
  config = config or MosaicConfig()
  if config.split_rule not in pallas_plan.SPLIT_RULES:
    raise ValueError(f"MosaicConfig.split_rule must be one of {pallas_plan.SPLIT_RULES}, "
                     f"got {config.split_rule!r}")
  if config.merge not in pallas_merge.MERGES:
    raise ValueError(f"MosaicConfig.merge must be one of {pallas_merge.MERGES}, "
                     f"got {config.merge!r}")
  if config.direct_registers is not None and (
      len(config.direct_registers) != 3 or sum(config.direct_registers) > LAUNCH_REGISTERS
      or any(r % 8 or not 24 <= r <= 256 for r in config.direct_registers)):
    raise ValueError("MosaicConfig.direct_registers must be three multiples of 8 in 24..256 "
                     f"summing to at most {LAUNCH_REGISTERS}, got {config.direct_registers!r}")
  num_tokens, num_heads = q.shape[:2]
  num_seqs = kv_indptr.shape[0] - 1
  rows = tokens_per_seq * num_heads
  padded_rows = -(-rows // BLOCK_ROWS) * BLOCK_ROWS
  row_blocks = padded_rows // BLOCK_ROWS
  num_indices = max(kv_indices.shape[0], 1)
  splits = num_kv_splits_ or pallas_plan.num_kv_splits(
      num_seqs, row_blocks, num_indices, BLOCK_KV, min_entries=config.min_split_entries,
      rule=config.split_rule)

  sink_rows = pallas_plan.sink_rows(sink, tokens_per_seq, padded_rows)
  in_kernel = config.inputs_in_kernel
  if in_kernel:
    q_inputs = (q.reshape(num_tokens * num_heads, layout.ROW_BYTES),
                q_rope.reshape(num_tokens * num_heads, layout.ROPE_DIM))
    # The producer reads a block's indices only for its valid rows, and clamps them; a list
    # shorter than a block is padded so that the block's slice of it has a static shape.
    indices = kv_indices.astype(jnp.int32)
    if indices.shape[0] < BLOCK_KV:
      indices = jnp.pad(indices, (0, BLOCK_KV - indices.shape[0]))
  else:
    q3 = q.reshape(num_seqs, rows, layout.ROW_BYTES)
    q_rope3 = q_rope.reshape(num_seqs, rows, layout.ROPE_DIM)
    q_bf16 = layout.unpack_rows(q3, q_rope3, jnp.bfloat16)
    q_inputs = (jnp.pad(q_bf16, ((0, 0), (0, padded_rows - rows), (0, 0))),)
    # A block's 64 entries past any start stay inside the list (padded with row 0, clamped
    # into the pool): the copies past a sequence's end read real rows, which the length mask
    # drops.
    num_padded = -(-(num_indices + BLOCK_KV) // BLOCK_KV) * BLOCK_KV
    indices = jnp.pad(kv_indices.astype(jnp.int32), (0, num_padded - kv_indices.shape[0]))
    indices = jnp.clip(indices, 0, kv.shape[0] - 1)

  pair = config.pair_row_blocks is not False and row_blocks % 2 == 0
  grid = dict(grid=(num_seqs, row_blocks, splits), grid_names=("seq", "rows", "split"))
  if pair:  # "rows" counts pairs of row blocks; "pair" (the cluster) one of the two
    grid.update(grid=(num_seqs, row_blocks // 2, splits), cluster=(2,), cluster_names=("pair",))
  scratch = mosaic_direct.scratch_types(pair=pair)
  kernel = functools.partial(mosaic_direct.kernel, num_splits=splits, rows=rows,
                             inputs_in_kernel=in_kernel, pair=pair,
                             registers=config.direct_registers)
  results = plgpu.kernel(
      kernel, out_type=pallas_plan.result_types(num_seqs, splits, padded_rows),
      scratch_types=scratch,
      compiler_params=plgpu.CompilerParams(approx_math=config.approx_math),
      num_threads=3, thread_name="wg", **grid,
  )(kv_indptr.astype(jnp.int32), indices, *q_inputs, kv, kv_rope, sink_rows)
  out, lse = pallas_merge.finish(results, splits, sink_rows, rows=rows, num_tokens=num_tokens,
                                 num_heads=num_heads, merge=config.merge)
  return out, (lse if return_lse else None)
