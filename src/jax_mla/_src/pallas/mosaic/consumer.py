"""The Mosaic GPU decode kernel's consumer math (mosaic.kernel): the online softmax step with
the split's length mask, and the epilogue that writes a warpgroup's half of the output and the
lse.

The softmax's row statistics are written in Mosaic GPU's IR (plgpu.inline_mgpu) rather than
with jnp reductions: on the H200 warpgroup 0 is the kernel's bound and waited ~250 cycles per
cross-lane shuffle (behind the kernel's shared-memory traffic), four of them in a row for the
max and four more for the sum every block. Now the max moves only when a warp's scores pass it
by more than MAX_SLACK_LOG2 (running_max), the sum's cross-lane part is taken once at the end
(partial_row_sum, finish_row_sum), and a thread's two rows shuffle together. H200, 2026-12-04,
128 heads B 128 K 2048: 198.1 us with jnp's reductions, 193.2 with the sum deferred and the
shuffles paired, 178.1 with the running max (benchmarks/README.md)."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jax_mla._src import layout
from jax_mla._src.jax_compat import read_only_ref_type
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
  rescaled by. l is each lane's partial sum (partial_row_sum): finish_row_sum makes it the
  row's."""
  plgpu = _plgpu()
  col = plgpu.broadcasted_iota(jnp.int32, s.shape, 1, layout=plgpu.Layout.WGMMA)
  s = jnp.where(col + base_entry < length, s * scale_log2, -jnp.inf)
  m_new = running_max(s, m_i)  # finite: every block has a valid entry
  alpha = jnp.exp2(m_i - m_new)
  p = jnp.exp2(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
  return p, alpha, m_new, l_i * alpha + partial_row_sum(p)


# The running row max m moves only when a block's scores pass it by more than this (log2
# units; P is then at most 2^MAX_SLACK_LOG2, far from overflowing O or l), so most blocks need
# no cross-lane max at all (running_max; the module docstring has what it measured).
MAX_SLACK_LOG2 = 8.0


def running_max(s, m_i):
  """The softmax's running max after scores s [64, N] (f32, WGMMA layout): m_i [64] (row
  layout) where no score of a row passes it by more than MAX_SLACK_LOG2, else max(m_i, the
  row's max). Any m works for the result (P, alpha and l all use it, and the lse is m plus
  log2 l); a stale one only scales P by up to 2^MAX_SLACK_LOG2. A warp decides for its 16 rows
  with one vote, and only a warp that must move m pays the four lanes' shuffles. A NaN score
  moves m (to NaN), as the exact max would."""
  plgpu = _plgpu()
  row_layout = plgpu.Layout.WGMMA.reduce(1)

  @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA, row_layout),
                     return_type=plgpu.ShapeDtypeStruct((BLOCK_ROWS,), jnp.float32,
                                                        layout=row_layout))
  def update(ctx, scores, m):
    del ctx
    return _emit_running_max(scores, m, MAX_SLACK_LOG2)

  return update(s, m_i)


def finish_row_sum(l_i):
  """softmax_scores's l (each lane's part of its rows' sums) as the rows' sums."""
  return _row_sum(l_i, lanes=True)


def partial_row_sum(p):
  """Each thread's sum of its values of each row of p [64, N] (f32, WGMMA layout), in the row
  layout [64] but not yet summed across the four lanes that share a row: the online softmax
  carries it so, and finish_row_sum completes it once, after the last block (as FlashMLA
  does), which takes two shuffles per row off every block's chain."""
  return _row_sum(p, lanes=False)


def rescale(acc, alpha):
  """O [64, 256] times the row factors alpha [64]."""
  return acc * lax.broadcast_in_dim(alpha, acc.shape, [0])


def accumulate_pv(acc, p, k_tiles, at):
  """O + P V on the tensor cores, accumulated in place: O [64, 256] f32, P [64, 64] bf16 in
  registers or a shared-memory ref, V the [64, 256] half k_tiles.at[at] of a K tile (V is K).
  The view is taken inside the run_state: one made outside it does not lower."""
  plgpu = _plgpu()

  def run(acc_ref):
    plgpu.wgmma(acc_ref, p, k_tiles.at[at])
  return pl.run_state(run)(plgpu.ACC.init(acc))


def row_sinks(sink_ref, row0, heads: int):
  """f32 [64] in the WGMMA row layout: the sinks of rows row0 .. row0 + 63 of a sequence, row r's
  sink_ref[r % heads] (a sequence's tokens repeat the heads'; a padding row past them gets a
  head's sink too, and its results are not kept). Each thread reads its two rows' straight
  from the sink [H], so no XLA kernel tiles or pads the sink into rows before the kernel
  (benchmarks/xla_kernels.py: one kernel fewer per call at 16 x 4 and 32 heads)."""
  plgpu = _plgpu()
  row_layout = plgpu.Layout.WGMMA.reduce(1)

  @plgpu.inline_mgpu(arg_types=(read_only_ref_type(), plgpu.Layout.WG_SPLAT(shape=())),
                     return_type=plgpu.ShapeDtypeStruct((BLOCK_ROWS,), jnp.float32,
                                                        layout=row_layout))
  def load(ctx, sink, first):
    del ctx
    return _emit_row_sinks(sink, first.registers.flat[0], heads)

  return load(sink_ref, row0)


def _emit_row_sinks(sink, row0, heads):
  """row_sinks's IR: a thread of the warpgroup holds rows 16 * warp + lane // 4 and that + 8
  (the WGMMA accumulator's rows, _thread_rows's order)."""
  # pylint: disable=import-outside-toplevel
  from jax.experimental.mosaic import gpu as mgpu
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import arith, gpu, memref
  i32 = ir.IntegerType.get_signless(32)
  c = lambda v: mgpu_utils.c(v, i32)
  thread = arith.remui(arith.index_cast(i32, gpu.thread_id(gpu.Dimension.x)), c(128))
  first = arith.addi(arith.muli(arith.divui(thread, c(32)), c(16)),
                     arith.divui(arith.remui(thread, c(32)), c(4)))
  per_row = [memref.load(sink, [arith.index_cast(
      ir.IndexType.get(), arith.remui(arith.addi(row0, arith.addi(first, c(h * 8))), c(heads)))])
             for h in range(2)]
  rows_layout = mgpu.WGMMA_ROW_LAYOUT
  return _row_array(per_row, rows_layout, rows_layout.registers_shape((BLOCK_ROWS,)))


def rows_lse2(m_i, l_i):
  """(seen, m made finite, lse2) of a warpgroup's rows after its last block: whether a row saw
  anything, and its lse in log2 units (-inf where it saw nothing)."""
  seen = l_i != 0  # NaN (a NaN scale in the row's data) counts as seen, so it propagates
  m_safe = jnp.where(seen, m_i, 0.0)
  return seen, m_safe, jnp.where(seen, m_safe + jnp.log2(jnp.where(seen, l_i, 1.0)), -jnp.inf)


def lse_with_sink(seen, lse2, sink):
  """(total2, lse) of rows whose lse without the sink is lse2 (log2 units, -inf where the row
  saw nothing; `seen` says which did): with the sink, in log2 units and in natural log. A row
  that saw nothing has the sink itself as its lse, not its round trip through log2 units."""
  total2 = logaddexp2(lse2, sink * LOG2E)
  return total2, jnp.where(seen, total2 * LN2, sink)


def normalized(acc, l_i, seen):
  """O [64, 256] divided by its rows' l: a split's softmax-normalized partial (0 where the row
  saw nothing), f32."""
  inv_l = jnp.where(seen, 1.0 / jnp.where(seen, l_i, 1.0), 0.0)
  return acc * lax.broadcast_in_dim(inv_l, acc.shape, [0])


def write_results(acc, m_i, l_i, *, half, seq, row0, split, num_splits, sink_ref, out_ref,
                  lse_ref, heads, stage_smem):
  """Output columns half * 256 .. + 255 of rows row0.. from this warpgroup's O [64, 256] and
  its m and l; half 0 also writes the lse. With one split: final bf16, sink and empty rows
  applied; with more: the softmax-normalized bf16 partial and its f32 lse for pallas.merge.

  stage_smem: a bf16 [64, 256] shared-memory tile this warpgroup may overwrite. The output
  goes through it and one TMA copy, instead of each thread storing its fragments of rows
  straight to global memory (4- or 8-byte stores, eight rows apart)."""
  plgpu = _plgpu()

  def store(value, at, valid=BLOCK_ROWS):
    """value [64, 256] into out_ref at `at`, of which the first `valid` rows (static) exist
    there."""
    stage_smem[...] = value
    plgpu.commit_smem()  # every thread's stores, before the TMA engine reads the tile
    tile = stage_smem if valid == BLOCK_ROWS else stage_smem.at[pl.ds(0, valid)]
    plgpu.copy_smem_to_gmem(tile, out_ref.at[at])
    # Before the CTA exits the copy must have read the tile; its global writes complete on
    # their own (the kernel's end orders them for the next kernel), as CUTLASS's epilogues
    # wait. Not slower than waiting for the writes (H100, 2026-12-05, mosaic_ab.py: 14.9
    # against 15.1 us at 128 heads B 8 K 512, 12.1 and 12.1 at B 1).
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  seen, m_safe, lse2 = rows_lse2(m_i, l_i)
  cols = pl.ds(half * HALF, HALF)
  rows = pl.ds(row0, BLOCK_ROWS)
  if num_splits == 1:
    total2, lse = lse_with_sink(seen, lse2, row_sinks(sink_ref, row0, heads))
    # out = acc * 2^(m - total): a +inf sink gives 0; empty rows are selected to 0.
    weight = jnp.where(seen, jnp.exp2(m_safe - total2), 0.0)
    # An output of fewer rows than a block (one block, e.g. 32 heads) takes only those: no
    # padding rows to slice off after the kernel (an XLA copy of the whole output).
    valid = min(out_ref.shape[1], BLOCK_ROWS)
    store((acc * lax.broadcast_in_dim(weight, acc.shape, [0])).astype(out_ref.dtype),
          (seq, pl.ds(row0, valid), cols), valid)
    lse_at = (seq, rows)
  else:
    # Partials of one row block hold only its real rows, as the output does.
    valid = min(out_ref.shape[2], BLOCK_ROWS)
    store(normalized(acc, l_i, seen).astype(out_ref.dtype),
          (seq, split, pl.ds(row0, valid), cols), valid)
    lse_at, lse = (seq, split, rows), lse2 * LN2

  def write_lse():
    lse_ref[lse_at] = lse
  if isinstance(half, int):  # a warpgroup that knows its half statically
    if half == 0:
      write_lse()
  else:
    pl.when(half == 0)(write_lse)


def _row_sum(x, *, lanes):
  """Sums rows of x (f32, WGMMA layout [64, N], or its row layout [64]) within each thread,
  and with `lanes` across the four lanes of a row (_quad_combine)."""
  plgpu = _plgpu()
  row_layout = plgpu.Layout.WGMMA.reduce(1)
  in_layout = plgpu.Layout.WGMMA if x.ndim == 2 else row_layout

  @plgpu.inline_mgpu(arg_types=(in_layout,),
                     return_type=plgpu.ShapeDtypeStruct((BLOCK_ROWS,), jnp.float32,
                                                        layout=row_layout))
  def reduce(ctx, arr):
    del ctx
    return _emit_row_sum(arr, lanes)

  return reduce(x)


def _thread_rows(arr):
  """A thread's registers of arr (FragmentedArray, WGMMA [64, N] or its row layout [64]) as
  [register, its two rows], and the row layout's registers shape."""
  # pylint: disable=import-outside-toplevel
  import numpy as np
  rows_layout = arr.layout if len(arr.shape) == 1 else arr.layout.reduce((1,))
  out_shape = rows_layout.registers_shape((BLOCK_ROWS,))
  regs = arr.registers.reshape(-1, 2) if len(arr.shape) == 2 else arr.registers.reshape(1, 2)
  if int(np.prod(out_shape)) != 2 or regs.size != arr.registers.size:
    raise NotImplementedError(f"unexpected register layout {arr.registers.shape}")
  return regs, rows_layout, out_shape


def _scalars(reg):
  # pylint: disable=import-outside-toplevel
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import llvm
  i32 = ir.IntegerType.get_signless(32)
  return [llvm.extractelement(reg, mgpu_utils.c(i, i32))
          for i in range(ir.VectorType(reg.type).shape[0])]


def _tree(values, combine):
  """values combined pairwise, for instruction-level parallelism."""
  while len(values) > 1:
    values = [combine(*values[i:i + 2]) if i + 1 < len(values) else values[i]
              for i in range(0, len(values), 2)]
  return values[0]


def _quad_combine(per_row, combine):
  """Each of a thread's row values combined over the four lanes of its row (xor-shuffles 1
  and 2). A thread holds two rows (r and r + 8): both rows' shuffles are emitted together, so
  their latencies overlap (Mosaic's reduce finishes one row's before it starts the other's)."""
  # pylint: disable=import-outside-toplevel
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import arith, llvm
  f32 = ir.F32Type.get()
  i32 = ir.IntegerType.get_signless(32)
  for offset in (1, 2):
    other = [arith.bitcast(f32, llvm.inline_asm(
        i32, [arith.bitcast(i32, v)], f"shfl.sync.bfly.b32 $0, $1, {offset}, 31, -1;",
        "=r,r", has_side_effects=False)) for v in per_row]
    per_row = [combine(v, o) for v, o in zip(per_row, other)]
  return per_row


def _row_array(per_row, rows_layout, out_shape):
  """A thread's two row values as a FragmentedArray of the row layout."""
  # pylint: disable=import-outside-toplevel
  import numpy as np
  from jax.experimental.mosaic import gpu as mgpu
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import llvm
  vec = ir.VectorType.get((1,), ir.F32Type.get())
  i32 = ir.IntegerType.get_signless(32)
  out = np.array([llvm.insertelement(llvm.mlir_undef(vec), v, mgpu_utils.c(0, i32))
                  for v in per_row], dtype=object).reshape(out_shape)
  return mgpu.FragmentedArray(_registers=out, _layout=rows_layout, _is_signed=None)


def _emit_running_max(scores, m, slack):
  """running_max's IR."""
  # pylint: disable=import-outside-toplevel
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import arith, llvm, scf
  f32 = ir.F32Type.get()
  i32 = ir.IntegerType.get_signless(32)
  regs, rows_layout, out_shape = _thread_rows(scores)
  m_regs, _, _ = _thread_rows(m)
  local = [_tree([v for reg in regs[:, h] for v in _scalars(reg)], arith.maximumf)
           for h in range(2)]
  old = [_scalars(m_regs[0, h])[0] for h in range(2)]
  # "unordered or greater": a NaN score moves m too.
  passed = [arith.cmpf(arith.CmpFPredicate.UGT, v, arith.addf(o, arith.constant(f32, slack)))
            for v, o in zip(local, old)]
  lane_moves = arith.extui(i32, arith.ori(*passed))
  warp_moves = llvm.inline_asm(
      i32, [lane_moves], "{ .reg .pred p, q; setp.ne.u32 p, $1, 0; "
      "vote.sync.any.pred q, p, -1; selp.u32 $0, 1, 0, q; }", "=r,r", has_side_effects=False)
  branch = scf.IfOp(arith.cmpi(arith.CmpIPredicate.ne, warp_moves, mgpu_utils.c(0, i32)),
                    [f32, f32], has_else=True)
  with ir.InsertionPoint(branch.then_block):
    row_max = _quad_combine(local, arith.maximumf)
    scf.YieldOp([arith.maximumf(o, v) for o, v in zip(old, row_max)])
  with ir.InsertionPoint(branch.else_block):
    scf.YieldOp(old)
  return _row_array(list(branch.results), rows_layout, out_shape)


def _emit_row_sum(arr, lanes):
  """_row_sum's IR on a FragmentedArray."""
  # pylint: disable=import-outside-toplevel
  from jaxlib.mlir.dialects import arith
  regs, rows_layout, out_shape = _thread_rows(arr)
  per_row = [_tree([v for reg in regs[:, h] for v in _scalars(reg)], arith.addf)
             for h in range(2)]
  if lanes:
    per_row = _quad_combine(per_row, arith.addf)
  return _row_array(per_row, rows_layout, out_shape)
