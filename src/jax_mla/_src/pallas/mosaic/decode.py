"""The fp8 MLA decode as a Pallas Mosaic GPU kernel (NVIDIA Hopper: wgmma, TMA, warpgroups).

`jax_mla.decode(..., backend="pallas")` (and "auto" on a GPU) runs it on sm90 GPUs
(pallas.backend); it lowers on any machine (checked in CI) and passes the oracle tests on an
H200; benchmarks/README.md has its speed.

One CTA per (sequence, block of 64 query rows, KV split) with three warpgroups: the kernel is
mosaic.kernel's (the producer gathers and dequantizes rows from global memory itself,
mosaic.gather, into two K tiles; the consumers run QK, the online softmax with the sink and
PV on the tensor cores). This module holds its measured choices, the split plan and the call.
The alternatives that lost (a "staged" design, other divisions of the consumers' work, XLA
passes over Q before the kernel, other register splits, split rules and merges) are summarised
with their figures in benchmarks/README.md; their code is in the history.

With one split the kernel finalizes (sink, empty rows) and writes bf16 out and lse; with more it
writes softmax-normalized bf16 partials and their f32 lse, merged by `pallas.merge` (its "auto"
choice), or, with CLUSTER_MERGE_SPLITS splits of unpaired CTAs, merges them itself: a
sequence's splits are one cluster (mosaic.cluster_merge).
Lengths and indices are device values: one executable serves every set of lengths. A second
KV source (`extra`) is read by the same CTAs (mosaic.kernel: the producer reads either pool);
without it, and at the default scale, the kernel lowers to the one-source kernel unchanged.
Q may be packed or bf16/f32 values as the model holds it (q_rope None): warpgroup 0 reads
either form into its bf16 Q tile; packed Q lowers as before. So may each pool (kv_rope None:
bf16/f32 rows, DeepSeek-V4's window cache as servers keep it): the producer copies its rows
into the K tile (f32 rounded to bf16) instead of dequantizing; packed pools lower as before.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

from jax_mla._src import layout
from jax_mla._src.pallas.mosaic import kernel as mosaic_direct
from jax_mla._src.pallas import merge as pallas_merge
from jax_mla._src.pallas import plan as pallas_plan
from jax_mla._src.kernel_math import score_scale_log2
from jax_mla._src.pallas.mosaic.consumer import BLOCK_KV, BLOCK_ROWS


# The shortest split the planner makes to fill the GPU when there are few (sequence, row block)
# programs. 64 against 256 on the H200 (2026-12-02, 128 heads, B 1): 34.6 against 52.4 us at
# K 2048, 27.9 against 44.2 at K 512.
MIN_SPLIT_ENTRIES = 64
# "waves" avoids a second, part-empty wave of CTAs: on the H200 (2026-12-03) faster than "fill" at
# every measured shape where the two plans differ, e.g. 126 against 166 us (64 heads, B 64,
# K 2048: 2 splits against 3) and 220 against 228 (128 heads, B 64, K 2048: 1 against 2).
SPLIT_RULE = "waves"
# The softmax's exp2 and the lse's log2 use the hardware approximations (ex2.approx, lg2.approx:
# relative error about 2^-22, far below bf16's): 3% faster on the H200 (2026-12-02, B 128,
# K 2048: 419 us against 433).
APPROX_MATH = True
# Unpaired CTAs with these many splits run each sequence's splits as one cluster that merges
# them through distributed shared memory (mosaic.cluster_merge) instead of writing partials
# for pallas.merge. H100, 2026-12-06 (benchmarks/README.md's choice table): 2 splits at B 64
# 21.9 against 24.4 us (16 x 4, K 512), 22.1 against 24.5 (64 heads), 57.9 against 59.1
# (32 heads, K 2048); 4 splits (B 32) lost, 33.4 against 17.0 us at 16 x 4: 32 clusters of
# four 223 KB CTAs do not fit the H100's 132 SMs in one wave.
CLUSTER_MERGE_SPLITS = (2,)
# Unpaired splits of at most SHORT_SPLIT_BLOCKS blocks (the static length hint) run with these
# registers per role instead of kernel.REGISTERS[False]: warpgroup 0 then keeps its block loop
# without spills. H100, 2026-12-07 (benchmarks/mosaic_ab.py, 3 rounds): 16.6 against 17.0 us at
# 16 x 4 B 32 K 512, 15.4 against 15.6 at 32 heads; for every unpaired split it lost 4% at
# 64 heads B 128 K 2048 (one split of 32 blocks), which this bound leaves as it was.
SHORT_SPLIT_REGISTERS = {0: 208, 1: 160, 2: 136}
SHORT_SPLIT_BLOCKS = 4


def _plgpu():
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  return plgpu


def mosaic_decode(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, *, tokens_per_seq: int,
                  num_kv_splits_: int | None = None, return_lse: bool = True,
                  softmax_scale: float | None = None, extra=None):
  """Decode with the Mosaic GPU kernel; arguments (float Q, softmax_scale and the second source
  `extra` included) as `pallas.triton.pallas_decode`.

  The kernel reads the packed fp8 Q and the raw index list itself (no XLA passes before it: GPU
  busy time on the H200, 2026-12-03, 128 heads, 39.5 against 46.4 us at B 64, K 512 and 216.9
  against 229.6 at B 128, K 2048). With an even number of 64-row blocks (128 heads) the two CTAs
  of a sequence share each block's gather in a cluster (mosaic.pair: 246.8 against 277.0 us at
  B 128, K 2048). With `extra` its producer reads both pools (mosaic.kernel). Float Q (bf16 or
  f32 values, q_rope None) is read by the kernel too (mosaic.gather.copy_consecutive: f32 is
  rounded to bf16 there), computed with as those bf16 values: no fp8 rounding, and none of the
  XLA kernels that packing it would take first. Float pools (bf16 or f32 rows [R, 512] with
  kv_rope None, in either source) are read by the producer the same way
  (mosaic.gather.gather_float): no gather and packing of their rows by XLA first."""
  plgpu = _plgpu()
  num_tokens, num_heads = q.shape[:2]
  num_seqs = kv_indptr.shape[0] - 1
  rows = tokens_per_seq * num_heads
  padded_rows = -(-rows // BLOCK_ROWS) * BLOCK_ROWS
  row_blocks = padded_rows // BLOCK_ROWS
  num_indices = max(kv_indices.shape[0] + (0 if extra is None else extra[3].shape[0]), 1)
  splits = num_kv_splits_ or pallas_plan.num_kv_splits(
      num_seqs, row_blocks, num_indices, BLOCK_KV, min_entries=MIN_SPLIT_ENTRIES,
      rule=SPLIT_RULE)

  options = {}
  if q_rope is None:  # float Q: the kernel reads the values (bf16; f32 rounded to bf16 there)
    q_inputs = (q.reshape(num_tokens * num_heads, layout.HEAD_DIM),)
    options["float_q"] = True
  else:
    q_inputs = (q.reshape(num_tokens * num_heads, layout.ROW_BYTES),
                q_rope.reshape(num_tokens * num_heads, layout.ROPE_DIM))
  if softmax_scale is not None:
    options["score_scale_log2"] = score_scale_log2(softmax_scale)
  extra_inputs = ()
  if extra is not None:
    kv2, kv_rope2, kv_indptr2, kv_indices2 = extra
    extra_inputs = (kv_indptr2.astype(jnp.int32), _block_of_indices_at_least(kv_indices2),
                    *pallas_plan.pool_inputs(kv2, kv_rope2))
    options["two_sources"] = True
  # Float pools: the producer copies their rows (bf16; f32 rounded to bf16 there).
  options.update(pallas_plan.float_kv_option(kv_rope, extra))

  pair = row_blocks % 2 == 0
  cluster_merge = not pair and splits in CLUSTER_MERGE_SPLITS
  grid = dict(grid=(num_seqs, row_blocks, splits), grid_names=("seq", "rows", "split"))
  if pair:  # "rows" counts pairs of row blocks; "pair" (the cluster) one of the two
    grid.update(grid=(num_seqs, row_blocks // 2, splits), cluster=(2,), cluster_names=("pair",))
  elif cluster_merge:  # a sequence's splits are one cluster
    grid.update(grid=(num_seqs, row_blocks), grid_names=("seq", "rows"), cluster=(splits,),
                cluster_names=("split",))
  blocks_per_split = -(-num_indices // max(num_seqs, 1) // splits // BLOCK_KV)
  if not pair and SHORT_SPLIT_REGISTERS and blocks_per_split <= SHORT_SPLIT_BLOCKS:
    options["registers"] = SHORT_SPLIT_REGISTERS
  scratch = mosaic_direct.scratch_types(pair=pair, cluster_merge=cluster_merge)
  kernel = functools.partial(mosaic_direct.kernel, num_splits=splits, rows=rows,
                             heads=num_heads, pair=pair, cluster_merge=cluster_merge, **options)
  results_splits = 1 if cluster_merge else splits
  real_rows = rows if row_blocks == 1 else padded_rows
  results = plgpu.kernel(
      # The split partials are bf16 (each rounded to bf16 before pallas.merge sums them in
      # f32; on random data of 8 splits the output's norm-wise error grows from 1.7e-3, its
      # own bf16 rounding, to 2.4e-3): half the bytes the kernel writes and the merge reads.
      # H100, 2026-12-05 (benchmarks/mosaic_ab.py, against f32 partials): 14.9 against 19.3 us
      # at 128 heads B 8 K 512 (the kernel 11.2 against 14.5), 17.5 against 23.0 at 16 x 4
      # B 32 K 512, 16.4 against 21.0 at 32 heads B 32 K 512.
      # With one row block the output has only the real rows (32 heads: 32 of 64); the kernel
      # writes those, so no XLA copy slices the padding off after it (H100, 2026-12-05: 30.5
      # against 37.6 us at 32 heads B 128 K 512). So do the split partials, which the merge
      # reads by real row anyway: half the bytes written at 32 heads (H100, 2026-12-07: 14.2
      # against 15.6 us at 32 heads B 32 K 512, the kernel 11.8 against 13.1).
      kernel, out_type=pallas_plan.result_types(
          num_seqs, results_splits, padded_rows, jnp.bfloat16, real_rows),
      scratch_types=scratch,
      # No warpgroup barriers around each shared-memory store (Pallas puts two there): the
      # kernel's stores are published by commit_smem before the barrier arrival that hands
      # them over (H200, 2026-12-04: 190.4 against 192.3 us at 128 heads B 128 K 2048).
      compiler_params=plgpu.CompilerParams(approx_math=APPROX_MATH,
                                           unsafe_no_auto_barriers=True),
      num_threads=3, thread_name="wg", **grid,
  )(kv_indptr.astype(jnp.int32), _block_of_indices_at_least(kv_indices), *q_inputs,
    # The sink as given: the kernel reads each row's (mosaic.consumer.row_sinks), and so does
    # the merge (by row inside XLA's fusion, by head in the merge kernel).
    *pallas_plan.pool_inputs(kv, kv_rope), sink.astype(jnp.float32), *extra_inputs)
  out, lse = pallas_merge.finish(results, results_splits, sink, rows=rows, num_tokens=num_tokens,
                                 num_heads=num_heads, merge="auto")
  return out, (lse if return_lse else None)


def _block_of_indices_at_least(kv_indices):
  """The producer reads a block's indices only for its valid rows, and clamps them; a list
  shorter than a block is padded so that the block's slice of it has a static shape."""
  indices = kv_indices.astype(jnp.int32)
  if indices.shape[0] < BLOCK_KV:
    indices = jnp.pad(indices, (0, BLOCK_KV - indices.shape[0]))
  return indices
