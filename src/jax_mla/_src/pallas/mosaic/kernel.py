"""The Mosaic GPU decode kernel (mosaic_decode's; first called the "direct" design): the producer
gathers and dequantizes rows from global memory itself, so two bf16 K tiles fit in shared
memory and the three warpgroups overlap. Passes the GPU tests of tests/test_mosaic.py on the
H200; at 128 heads, batch 64-128 it is 3.0 to 3.3 times plain XLA in GPU busy time per call
(2026-12-03; benchmarks/README.md).

Roles, per CTA (one sequence, 64 query rows, one KV split), after FlashMLA's sm90 kernel:

- warpgroup 2 (producer): for each block of 64 entries, `mosaic_gather.gather_step`
  (per-thread 16-byte loads, hardware fp8 conversion, scaled bf16 into the swizzled tile) into
  K tile `step % 2`, then signals k_full. Its loads run a block ahead: each step converts the
  words the previous one loaded and issues the next block's (2026-12-04, H200: 198.2 against
  202.7 us at 128 heads, B 128, K 2048). It refills a tile once both consumers freed it. With
  paired CTAs (mosaic.pair) it gathers half of each block into its own tile and sends that half
  to the peer's by bulk copy (mosaic.pair.copy_to_peer; a float pool's by st.async). A float pool
  (bf16 or f32 rows, float_kv) it copies instead (`mosaic_gather.gather_float`: bf16 as it is,
  f32 rounded to bf16), into the same tile with the same barriers.
- warpgroup 0: S = Q K^T over all 512 dims (one 64 x 64 accumulator), the online softmax,
  P (bf16) and the row factors into shared memory for warpgroup 1, O[:, :256] += P V[:, :256].
- warpgroup 1: rescales its O[:, 256:] by the factors and adds P V[:, 256:], P read from
  shared memory by its wgmma; m and l come from warpgroup 0 at the end.

So the dequantization of block n + 1 runs beside the MMAs of block n, and warpgroup 1's PV
beside warpgroup 0's next QK. Shared memory: Q 64 KB + K 2 x 64 KB + P 8 KB = 200 KB.

Other divisions of the consumers' work lost on the H200 and were removed (2026-12-04, also because
their register-fragment stores no longer lower on jax 0.12); benchmarks/README.md has the
measurements, 128 heads, B 128, K 2048: warpgroup 0 handing warpgroup 1 S in f32, both running the
softmax ("s_exchange": 296.9 against 277.0 us unpaired); either with the next block's QK issued
before this block's softmax ("qk_ahead": 443.8, and 381.2 against 249.5 paired: ptxas spilled);
FlashMLA's "seesaw" block pairing (495.5); writing the one-split output straight from registers
instead of through shared memory and a TMA copy (218.3 against 209.0).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jax_mla._src.pallas.mosaic import cluster_merge as mosaic_cluster_merge
from jax_mla._src.pallas.mosaic import consumer as mosaic_consumer
from jax_mla._src.pallas.mosaic import gather as mosaic_gather
from jax_mla._src.pallas.mosaic import pair as mosaic_pair
from jax_mla._src.pallas import plan as pallas_plan
from jax_mla._src.jax_compat import mgpu_load
from jax_mla._src.kernel_math import SCORE_SCALE_LOG2, split_chunks, split_two_sources
from jax_mla._src.pallas.mosaic.consumer import BLOCK_KV, BLOCK_ROWS, HALF

NUM_K_TILES = 2
# setmaxnreg per role (warpgroups 0, 1, producer; multiples of 8), summing to at most
# mosaic_consumer.LAUNCH_REGISTERS, paired and unpaired. Warpgroup 1 holds only its half of O;
# the producer holds the loaded words of the row groups it carries (mosaic.gather). Unpaired
# (64 heads, 16 x 4) the producer is the bound and gets more: H200, 2026-12-04, 104.1 against
# 109.6 us at 64 heads B 128 K 2048, 61.5 against 66.1 at 16 x 4 B 64 K 2048; the paired kernel
# lost 14% with them (226.7 against 198.8 at 128 heads B 128 K 2048).
REGISTERS = {True: {0: 216, 1: 160, 2: 128}, False: {0: 192, 1: 160, 2: 152}}


def region(name):
  """A named region of a warpgroup's code (jax.named_scope): what the Mosaic GPU profiler times
  when the kernel is built with a profile space (benchmarks/mosaic_regions.py); without one it
  emits nothing."""
  return jax.named_scope(name)


def scratch_types(pair=False, cluster_merge=False):
  """The kernel's shared memory. Warpgroup 0 hands warpgroup 1 P (bf16, a wgmma operand) and
  the row factors each step, and its final m and l at the end. pair (mosaic.pair): K tiles are
  filled by both CTAs of a cluster, so `ready` (PTX-driven barriers) replaces k_full, and
  k_free counts both CTAs' consumers. cluster_merge (mosaic.cluster_merge): its lse and out
  tiles."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  swizzled = mosaic_gather.k_tile_transforms()
  k_tiles = plgpu.SMEM((NUM_K_TILES, 2, BLOCK_KV, HALF), jnp.bfloat16, transforms=swizzled)
  scratch = dict(
      q_smem=plgpu.SMEM((2, BLOCK_ROWS, HALF), jnp.bfloat16, transforms=swizzled),
      k_smem=k_tiles,
  )
  scratch.update(s_full=plgpu.Barrier(num_arrivals=1), s_free=plgpu.Barrier(num_arrivals=1))
  scratch.update(p_smem=plgpu.SMEM((BLOCK_ROWS, BLOCK_KV), jnp.bfloat16, transforms=swizzled),
                 # Row factors per step; m and l after the last.
                 rows_smem=plgpu.SMEM((2, BLOCK_ROWS), jnp.float32),
                 ml_full=plgpu.Barrier(num_arrivals=1))
  if pair:
    scratch.update(ready=mosaic_pair.ready_barriers(NUM_K_TILES),
                   k_free=plgpu.ClusterBarrier(collective_axes=("pair",), num_arrivals=2,
                                               num_barriers=NUM_K_TILES))
  else:
    scratch.update(k_full=plgpu.Barrier(num_arrivals=1, num_barriers=NUM_K_TILES),
                   k_free=plgpu.Barrier(num_arrivals=2, num_barriers=NUM_K_TILES))
  if cluster_merge:
    scratch.update(mosaic_cluster_merge.scratch_types())
  return scratch


def kernel(indptr_ref, idx_ref, q_ref, *refs, q_smem, k_smem, k_free, num_splits, rows, heads,
           s_full, s_free, p_smem, rows_smem, ml_full, k_full=None, ready=None, pair=False,
           score_scale_log2=SCORE_SCALE_LOG2, two_sources=False, float_q=False,
           float_kv=(False, False), cluster_merge=False, lse_smem=None, out_smem=None,
           registers=None):
  """q_ref: the packed fp8 Q as rows [T * H, 512] uint8, followed in refs by its RoPE q_rope_ref
  [T * H, 64] bf16; or (float_q) Q's values [T * H, 512] bf16 or f32, without a RoPE ref.
  refs then: the pool, its RoPE, the sink f32 [heads]; with two_sources the second source's
  indptr, indices, pool and RoPE; then the outputs (out, lse). rows: query rows per sequence
  (tokens_per_seq * heads).
  score_scale_log2: kernel_math's. float_kv: per source (A, B), whether its pool holds float
  rows [R, 512] bf16 or f32 (a window cache as servers keep it), without a RoPE ref; the
  producer copies them into the K tile (mosaic.gather.gather_float: f32 rounded to bf16).

  Two sources (DeepSeek-V4's window and top-k): a split's steps walk its blocks of source A,
  then of source B (kernel_math.split_two_sources). Only the producer reads the pools, so only
  it branches: one loop over A's blocks from A's pool, one over B's from B's, numbering the
  steps (K tiles, barrier phases) on from each other. The consumers see one sequence of steps;
  per step they pick the source's length and first entry for the mask.

  Warpgroup 0 dequantizes its Q block from the packed rows itself (float Q: copies it, f32
  rounded to bf16; mosaic.gather.copy_consecutive), and the producer clamps the indices, so the
  call needs no XLA passes over Q and the indices first. s_full / s_free guard
  P and the row factors; warpgroup 1 takes m and l from warpgroup 0 at the end. pair
  (mosaic.pair): the grid's "rows" axis counts pairs of row blocks, the cluster axis "pair"
  picks one of the two, and the two CTAs share each block's gather. mosaic.decode has the
  speeds.

  Each consumer writes its bf16 half of the output (one split) or of its split's partial
  through its half of q_smem and a TMA copy. Safe because warpgroup 1 never reads Q, warpgroup
  0 has read its last QK's operands before its loop ends, and warpgroup 1 writes only after
  ml_full, which warpgroup 0 arrives on after its loop (and after writing Q). bf16 partials
  halve what the kernel writes and the merge reads (mosaic.decode has the figures).
  cluster_merge (mosaic.cluster_merge): the grid's cluster axis "split" holds the sequence's
  splits, which merge their partials through distributed shared memory and write the final
  out and lse instead. registers: the setmaxnreg per role, REGISTERS[pair] unless given."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  if float_q:
    q_rope_ref = None
  else:
    q_rope_ref, refs = refs[0], refs[1:]
  (kv_ref, rope_ref), refs = pallas_plan.pool_refs(refs, float_kv[0])
  sink_ref, *refs = refs
  seq = lax.axis_index("seq")
  if pair:
    rank = lax.axis_index("pair")
    row0 = (lax.axis_index("rows") * 2 + rank) * BLOCK_ROWS
    mosaic_pair.init_ready_barriers(ready)
  else:
    row0 = lax.axis_index("rows") * BLOCK_ROWS
  split = lax.axis_index("split")
  wg = lax.axis_index("wg")
  out_ref, lse_ref = refs[-2:]
  if two_sources:
    indptr_b, idx_b, *refs = refs
    (kv_b, rope_b), _ = pallas_plan.pool_refs(refs, float_kv[1])
    (start, length, chunk_lo, chunk_hi), (start_b, length_b, lo_b, hi_b) = split_two_sources(
        indptr_ref, indptr_b, seq, split, num_splits, BLOCK_KV)
    steps_a = chunk_hi - chunk_lo
    steps = steps_a + (hi_b - lo_b)
    # Per source: (indices, pool, RoPE, start, length, block of step 0, its first step).
    sources = [(idx_ref, kv_ref, rope_ref, start, length, chunk_lo, 0),
               (idx_b, kv_b, rope_b, start_b, length_b, lo_b - steps_a, steps_a)]
  else:
    start = indptr_ref[seq]
    length, chunk_lo, chunk_hi = split_chunks(start, indptr_ref[seq + 1], split, num_splits,
                                              BLOCK_KV)
    steps = chunk_hi - chunk_lo
    sources = [(idx_ref, kv_ref, rope_ref, start, length, chunk_lo, 0)]
  step_ends = [source[-1] for source in sources[1:]] + [steps]

  def entries_of(i):
    """(the first entry of step i's block in its source's list, that list's length)."""
    if not two_sources:
      return (chunk_lo + i) * BLOCK_KV, length
    in_a = i < steps_a
    return (jnp.where(in_a, chunk_lo, lo_b - steps_a) + i) * BLOCK_KV, jnp.where(
        in_a, length, length_b)

  def set_registers(role):
    # setmaxnreg.dec to more than the launch's share (or .inc to less) is an illegal
    # instruction.
    share = mosaic_consumer.LAUNCH_REGISTERS // 3
    count = (registers or REGISTERS[pair])[role]
    plgpu.set_max_registers(count, action="increase" if count > share else "decrease")

  def fill(idx, kv, rope, start, length, block0, first_step, end):
    """The producer's steps first_step .. end - 1: the K tile of block block0 + step of one
    source. A packed pool's loads run a block ahead (mosaic_gather.gather_step): each step
    converts the loads the previous one issued."""

    def block(step):
      """(the block's index list, its number of valid rows) at `step`; an empty split's block is
      all invalid rows: zeros, and no index read."""
      first = (block0 + step) * BLOCK_KV
      return idx.at[pl.ds(start + first, BLOCK_KV)], jnp.clip(length - first, 0, BLOCK_KV)

    def wait_free(step):
      tile = lax.rem(step, NUM_K_TILES)

      @pl.when(step >= NUM_K_TILES)
      def _wait_free():
        plgpu.barrier_wait(k_free.at[tile])
      return tile, ((rank, ready, tile) if pair else None)

    def filled(tile, packed=True):
      if pair:
        if packed:  # the rows this CTA gathered, on to the peer's tile (float rows: st.async)
          mosaic_pair.copy_to_peer(k_smem.at[tile], ready, tile, rank)
        mosaic_pair.arrive_filled(ready, tile)
      else:
        plgpu.commit_smem()  # the stores, before wgmma reads the tile
        plgpu.barrier_arrive(k_full.at[tile])

    if rope is None:  # a float pool: its values, rounded to bf16
      @pl.loop(first_step, end)
      def _fill(step):
        with region("free_wait"):
          tile, pair_args = wait_free(step)
        with region("gather"):
          block_idx, num_valid = block(step)
          mosaic_gather.gather_float(kv, block_idx, num_valid, k_smem.at[tile], clamp=True,
                                     pair=pair_args)
          filled(tile, packed=False)
      return

    def fill_step(step, carried):
      with region("free_wait"):
        tile, pair_args = wait_free(step)
      with region("gather"):
        has_next = step + 1 < end
        next_idx, next_valid = block(jnp.where(has_next, step + 1, step))
        carried = mosaic_gather.gather_step(
            kv, rope, *block(step), next_idx, jnp.where(has_next, next_valid, 0),
            k_smem.at[tile], carried, clamp=True, rank=rank if pair else None)
        filled(tile)
      return carried

    # With no step at all the prologue reads the list's first entry (the list holds at least
    # a block) and pool row 0 only.
    with region("first_loads"):
      _, first_valid = block(first_step)
      any_step = first_step < end
      carried = mosaic_gather.gather_issue(
          kv, rope, idx.at[pl.ds(jnp.where(any_step, start + (block0 + first_step) * BLOCK_KV,
                                           0), BLOCK_KV)],
          jnp.where(any_step, first_valid, 0), clamp=True, rank=rank if pair else None)
    lax.fori_loop(first_step, end, fill_step, carried)

  @pl.when(wg == 2)
  def _producer():
    set_registers(2)
    for source, end in zip(sources, step_ends):
      fill(*source, end)
    if cluster_merge:  # the consumers' cluster barrier after their partials (every thread's)
      mosaic_pair.cluster_sync()

  wgmma_layout = plgpu.Layout.WGMMA

  def wait_filled(step):
    """Waits until K tile step % 2 holds block `step` (both halves of it, with pair)."""
    tile = lax.rem(step, NUM_K_TILES)
    if pair:  # the tile's use number step // 2 is its barrier's phase
      mosaic_pair.wait_filled(ready, tile, lax.rem(lax.div(step, NUM_K_TILES), 2))
    else:
      plgpu.barrier_wait(k_full.at[tile])

  def write_half(acc, m_i, l_i, half):
    # The results (the final output, or bf16 partials) leave through this warpgroup's half of
    # q_smem and a TMA copy.
    if cluster_merge:
      mosaic_cluster_merge.write_merged(
          acc, m_i, l_i, half=half, seq=seq, row0=row0, rank=split, num_splits=num_splits,
          sink_ref=sink_ref, out_ref=out_ref, lse_ref=lse_ref, heads=heads,
          stage_smem=q_smem.at[half], lse_smem=lse_smem, out_smem=out_smem.at[half])
      return
    mosaic_consumer.write_results(acc, m_i, l_i, half=half, seq=seq, row0=row0, split=split,
                                  num_splits=num_splits, sink_ref=sink_ref, out_ref=out_ref,
                                  lse_ref=lse_ref, heads=heads, stage_smem=q_smem.at[half])

  def issue_qk(acc_ref, tile):
    for h in range(2):
      plgpu.wgmma(acc_ref, q_smem.at[h], k_smem.at[tile, h].T)

  s_accumulator = plgpu.ACC((BLOCK_ROWS, BLOCK_KV), jnp.float32)

  def softmax_for_both():
    """Warpgroup 0's loop: QK, the softmax, P and the row factors published for warpgroup 1,
    its own PV; m and l published at the end."""

    def softmax_and_pv(i, s, tile, acc, m_i, l_i):
      with region("softmax"):
        p, alpha, m_i, l_i = mosaic_consumer.softmax_scores(s, *entries_of(i), m_i, l_i,
                                                            score_scale_log2)
        p = p.astype(jnp.bfloat16)

      with region("p_free_wait"):
        @pl.when(i > 0)
        def _wait_p_free():  # warpgroup 1's PV of the previous block is done with P
          plgpu.barrier_wait(s_free)
      with region("p_publish"):
        p_smem[...] = p
        rows_smem[0] = alpha
        plgpu.commit_smem()  # P, before warpgroup 1's wgmma reads it
        plgpu.barrier_arrive(s_full)
      with region("pv"):
        acc = mosaic_consumer.accumulate_pv(mosaic_consumer.rescale(acc, alpha), p, k_smem,
                                            (tile, 0))
      return acc, m_i, l_i

    def step(i, carry):
      acc, m_i, l_i = carry
      tile = lax.rem(i, NUM_K_TILES)
      with region("tile_wait"):
        wait_filled(i)

      def qk(acc_ref):
        issue_qk(acc_ref, tile)
        return acc_ref[...]
      with region("qk"):
        s = pl.run_scoped(qk, s_accumulator)
      acc, m_i, l_i = softmax_and_pv(i, s, tile, acc, m_i, l_i)
      plgpu.barrier_arrive(k_free.at[tile])  # warpgroup 0's MMAs on the tile are done
      return acc, m_i, l_i

    acc, m_i, l_i = lax.fori_loop(0, steps, step, mosaic_consumer.initial_state())
    with region("epilogue"):
      l_i = mosaic_consumer.finish_row_sum(l_i)

      @pl.when(steps > 0)
      def _wait_last_p_free():  # warpgroup 1 read the last factors before they are replaced
        plgpu.barrier_wait(s_free)
      rows_smem[0] = m_i
      rows_smem[1] = l_i
      plgpu.commit_smem()  # every thread's stores, before the arrival that publishes them
      plgpu.barrier_arrive(ml_full)
      write_half(acc, m_i, l_i, 0)

  def pv_from_shared_p():
    """Warpgroup 1's loop: rescale its half of O, then
    O += P V from shared memory; m and l from warpgroup 0 at the end."""
    row_layout = wgmma_layout.reduce(1)

    def step(i, acc):
      tile = lax.rem(i, NUM_K_TILES)
      with region("p_wait"):
        if pair:  # complete already (warpgroup 0 waited before publishing P); observed here
          # too, so that this warpgroup's wgmma reads of the peer's st.async bytes follow it
          wait_filled(i)
        plgpu.barrier_wait(s_full)
      with region("pv"):
        alpha = mgpu_load(rows_smem.at[0], layout=row_layout, optimized=False)
        acc = mosaic_consumer.accumulate_pv(mosaic_consumer.rescale(acc, alpha), p_smem,
                                            k_smem, (tile, 1))
      plgpu.barrier_arrive(s_free)  # P and the factors may be replaced
      plgpu.barrier_arrive(k_free.at[tile])
      return acc

    acc = lax.fori_loop(0, steps, step, mosaic_consumer.initial_state()[0])
    with region("ml_wait"):
      plgpu.barrier_wait(ml_full)
    with region("epilogue"):
      m_i = mgpu_load(rows_smem.at[0], layout=row_layout, optimized=False)
      l_i = mgpu_load(rows_smem.at[1], layout=row_layout, optimized=False)
      write_half(acc, m_i, l_i, 1)

  @pl.when(wg == 0)
  def _qk_consumer():
    set_registers(0)
    with region("q_load"):
      if float_q:
        mosaic_gather.copy_consecutive(q_ref, seq * rows + row0,
                                       jnp.clip(rows - row0, 0, BLOCK_ROWS), q_smem)
      else:
        mosaic_gather.gather_consecutive(q_ref, q_rope_ref, seq * rows + row0,
                                         jnp.clip(rows - row0, 0, BLOCK_ROWS), q_smem)
      plgpu.commit_smem()  # the stores, before this warpgroup's wgmma reads them
    softmax_for_both()

  @pl.when(wg == 1)
  def _pv_consumer():
    set_registers(1)
    pv_from_shared_p()

  if pair or cluster_merge:
    mosaic_pair.cluster_sync()
