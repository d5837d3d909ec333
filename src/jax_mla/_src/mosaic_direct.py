"""The Mosaic GPU decode kernel (mosaic_decode's; first called the "direct" design): the producer
gathers and dequantizes rows from global memory itself, so two bf16 K tiles fit in shared
memory and the three warpgroups overlap. Passes the GPU tests of tests/test_mosaic.py on the
H200; at 128 heads, batch 64-128 it is 3.0 to 3.3 times plain XLA in GPU busy time per call
(2026-12-03; benchmarks/NOTES-pallas.md).

Roles, per CTA (one sequence, 64 query rows, one KV split), after FlashMLA's sm90 kernel, with
the default "p_exchange" consumers (CONSUMERS below has the others):

- warpgroup 2 (producer): for each block of 64 entries, `mosaic_gather.gather_dequantize`
  (per-thread 16-byte loads, hardware fp8 conversion, scaled bf16 into the swizzled tile) into
  K tile `step % 2`, then signals k_full. It refills a tile once both consumers freed it. With
  paired CTAs (mosaic_pair) it gathers half of each block into both CTAs' tiles.
- warpgroup 0: S = Q K^T over all 512 dims (one 64 x 64 accumulator), the online softmax,
  P (bf16) and the row factors into shared memory for warpgroup 1, O[:, :256] += P V[:, :256].
- warpgroup 1: rescales its O[:, 256:] by the factors and adds P V[:, 256:], P read from
  shared memory by its wgmma; m and l come from warpgroup 0 at the end.

So the dequantization of block n + 1 runs beside the MMAs of block n, and warpgroup 1's PV
beside warpgroup 0's next QK. Shared memory: Q 64 KB + K 2 x 64 KB + P 8 KB = 200 KB (the S
exchange's f32 S instead: 16 KB and its padding, 2 KB at the default MosaicConfig.s_padding).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jax_mla._src import mosaic_consumer
from jax_mla._src import mosaic_gather
from jax_mla._src import mosaic_pair
from jax_mla._src.kernel_math import split_chunks
from jax_mla._src.mosaic_consumer import BLOCK_KV, BLOCK_ROWS, HALF

NUM_K_TILES = 2
# How the two consumer warpgroups divide a block's work (MosaicConfig.consumers):
# "p_exchange": warpgroup 0 computes S and runs the softmax, and hands warpgroup 1 P (bf16, in
#   shared memory, its wgmma operand) and the row factors; warpgroup 1 only rescales its half
#   of O and adds P V. FlashMLA's sm90 split of the work.
# "s_exchange": warpgroup 0 computes S and hands it to warpgroup 1 in f32; both run the same
#   softmax (the same operations on the same values, so the same m and l bit for bit).
# "s_exchange_qk_ahead": "s_exchange", with warpgroup 0 issuing block n + 1's QK before block
#   n's softmax and PV, so the tensor cores compute it while the softmax runs.
# "p_exchange_qk_ahead": "p_exchange", with the same early QK.
# (A "seesaw", FlashMLA's other order with the blocks taken in pairs and one QK per warpgroup
# per pair, ran at 495.5 against 296.9 us and was removed on 2026-12-03: NOTES-pallas.md.)
CONSUMERS = ("p_exchange", "p_exchange_qk_ahead", "s_exchange", "s_exchange_qk_ahead")
# setmaxnreg per role (warpgroups 0, 1, producer; multiples of 8), summing to
# mosaic_consumer.LAUNCH_REGISTERS, per consumer split. The producer holds the loaded words of
# two row groups.
REGISTERS = {
    # Warpgroup 1 holds only its half of O. ptxas (H200, 2026-12-03): no spills.
    "p_exchange": {0: 216, 1: 160, 2: 128},
    # Warpgroup 0 also holds the next block's S (32 registers). ptxas (H200, 2026-12-03):
    # spills 68 bytes and injects a warpgroup.arrive (C7519); 381.2 against 249.5 us for
    # "p_exchange" (128 heads, B 128, K 2048).
    "p_exchange_qk_ahead": {0: 232, 1: 160, 2: 112},
    # Warpgroup 0 holds S and half of O, warpgroup 1 the other half, S and P. ptxas on the
    # H200 (2026-12-03): at 192 / 160 / 152 it spilled 276 bytes and serialized every wgmma
    # for lack of registers (C7512); at 208 / 184 / 112 it spills 88 bytes and serializes
    # nothing, and the kernel took 297.4 against 326.7 us (128 heads, B 128, K 2048); with
    # the producer at 96 it was slower than either (359.1 at 216 / 192 / 96).
    "s_exchange": {0: 208, 1: 184, 2: 112},
    # Warpgroup 0 also holds the next block's S accumulator while it works on this one's (32
    # more registers per thread); the producer gives them up.
    "s_exchange_qk_ahead": {0: 224, 1: 160, 2: 120},
}


def scratch_types(consumers, s_padding=0, pair=False):
  """The kernel's shared memory. pair (mosaic_pair): K tiles are filled by both CTAs of a
  cluster, so `ready` (PTX-driven barriers) replaces k_full, and k_free counts both CTAs'
  consumers. "p_exchange": warpgroup 0 hands warpgroup 1 P (bf16, a wgmma operand) and the
  row factors instead of S, and its final m and l at the end."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  swizzled = mosaic_gather.k_tile_transforms()
  k_tiles = plgpu.SMEM((NUM_K_TILES, 2, BLOCK_KV, HALF), jnp.bfloat16, transforms=swizzled)
  scratch = dict(
      q_smem=plgpu.SMEM((2, BLOCK_ROWS, HALF), jnp.bfloat16, transforms=swizzled),
      k_smem=k_tiles,
      q_bar=plgpu.Barrier(num_arrivals=2),
  )
  scratch.update(s_full=plgpu.Barrier(num_arrivals=1), s_free=plgpu.Barrier(num_arrivals=1))
  if consumers.startswith("p_exchange"):
    scratch.update(p_smem=plgpu.SMEM((BLOCK_ROWS, BLOCK_KV), jnp.bfloat16, transforms=swizzled),
                   # Row factors per step; m and l after the last.
                   rows_smem=plgpu.SMEM((2, BLOCK_ROWS), jnp.float32),
                   ml_full=plgpu.Barrier(num_arrivals=1))
  else:
    scratch.update(s_smem=plgpu.SMEM((BLOCK_ROWS, BLOCK_KV + s_padding), jnp.float32))
  if pair:
    scratch.update(ready=mosaic_pair.ready_barriers(NUM_K_TILES),
                   k_free=plgpu.ClusterBarrier(collective_axes=("pair",), num_arrivals=2,
                                               num_barriers=NUM_K_TILES))
  else:
    scratch.update(k_full=plgpu.Barrier(num_arrivals=1, num_barriers=NUM_K_TILES),
                   k_free=plgpu.Barrier(num_arrivals=2, num_barriers=NUM_K_TILES))
  return scratch


def kernel(indptr_ref, idx_ref, *refs, q_smem, k_smem, q_bar, k_free, num_splits, rows,
           s_full=None, s_free=None, s_smem=None, k_full=None, ready=None, p_smem=None,
           rows_smem=None, ml_full=None, consumers="p_exchange", inputs_in_kernel=False,
           pair=False, registers=None, stage_output=False):
  """refs: q_ref (bf16 [B, padded rows, 512]), kv_ref, rope_ref, sink_ref, out_ref, lse_ref;
  with inputs_in_kernel, q_ref and q_rope_ref (the packed fp8 Q as rows [T * H, 512] uint8
  and [T * H, 64] bf16) in q_ref's place. rows: query rows per sequence.

  consumers: one of CONSUMERS (above). With "p_exchange" s_full / s_free guard P and the
  row factors, and warpgroup 1 takes m and l from warpgroup 0 at the end. With "_qk_ahead"
  the producer fills at least one tile, so that the first QK never waits for a block that
  does not come. inputs_in_kernel (MosaicConfig.inputs_in_kernel):
  warpgroup 0 dequantizes its Q block from the packed rows itself, and the producer clamps
  the indices, so the call needs no XLA passes over Q and the indices first. pair
  (mosaic_pair): the grid's "rows" axis counts pairs of row blocks, the cluster axis "pair"
  picks one of the two, and the two CTAs share each block's gather. Which combinations
  passed the GPU tests on the H200 is in benchmarks/NOTES-pallas.md; MosaicConfig has the
  speeds. stage_output (the "p_exchange" consumers only): with one split each consumer writes
  its bf16 half of the output through its half of q_smem and a TMA copy. Safe there because
  warpgroup 1 never reads Q, warpgroup 0 has read its last QK's operands before its loop
  ends, and warpgroup 1 writes only after ml_full, which warpgroup 0 arrives on after its
  loop (and after writing Q, with inputs_in_kernel). (The f32 partials of several splits
  went the same way, through an f32 tile laid over the dead K tiles: no faster on the H200,
  2026-12-03, so removed; benchmarks/NOTES-pallas.md.)"""
  qk_ahead = consumers.endswith("_qk_ahead")
  p_exchange = consumers.startswith("p_exchange")
  if inputs_in_kernel:
    q_ref, q_rope_ref, kv_ref, rope_ref, sink_ref, out_ref, lse_ref = refs
  else:
    q_ref, kv_ref, rope_ref, sink_ref, out_ref, lse_ref = refs
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  seq = lax.axis_index("seq")
  if pair:
    rank = lax.axis_index("pair")
    row0 = (lax.axis_index("rows") * 2 + rank) * BLOCK_ROWS
    mosaic_pair.init_ready_barriers(ready)
  else:
    row0 = lax.axis_index("rows") * BLOCK_ROWS
  split = lax.axis_index("split")
  wg = lax.axis_index("wg")
  start = indptr_ref[seq]
  length, chunk_lo, chunk_hi = split_chunks(start, indptr_ref[seq + 1], split, num_splits,
                                            BLOCK_KV)
  steps = chunk_hi - chunk_lo
  registers = REGISTERS[consumers] if registers is None else dict(enumerate(registers))

  def set_registers(role):
    # setmaxnreg.dec to more than the launch's share (or .inc to less) is an illegal
    # instruction.
    share = mosaic_consumer.LAUNCH_REGISTERS // 3
    plgpu.set_max_registers(registers[role],
                            action="increase" if registers[role] > share else "decrease")

  @pl.when(wg == 2)
  def _producer():
    set_registers(2)

    # An empty split's block is all invalid rows: zeros, and no index read.
    @pl.loop(0, jnp.maximum(steps, 1) if qk_ahead else steps)
    def _fill(step):
      tile = lax.rem(step, NUM_K_TILES)

      @pl.when(step >= NUM_K_TILES)
      def _wait_free():
        plgpu.barrier_wait(k_free.at[tile])

      first = (chunk_lo + step) * BLOCK_KV
      num_valid = jnp.clip(length - first, 0, BLOCK_KV)
      mosaic_gather.gather_dequantize(kv_ref, rope_ref, idx_ref.at[pl.ds(start + first, BLOCK_KV)],
                                      num_valid, k_smem.at[tile], clamp=inputs_in_kernel,
                                      pair=(rank, ready, tile) if pair else None)
      if pair:
        mosaic_pair.arrive_filled(ready, tile)
      else:
        plgpu.commit_smem()  # the stores, before wgmma reads the tile
        plgpu.barrier_arrive(k_full.at[tile])

  wgmma_layout = plgpu.Layout.WGMMA

  def wait_filled(step):
    """Waits until K tile step % 2 holds block `step` (both halves of it, with pair)."""
    tile = lax.rem(step, NUM_K_TILES)
    if pair:  # the tile's use number step // 2 is its barrier's phase
      mosaic_pair.wait_filled(ready, tile, lax.rem(lax.div(step, NUM_K_TILES), 2))
    else:
      plgpu.barrier_wait(k_full.at[tile])

  def pv(acc, p, tile, half):
    """O[:, half] += P V[:, half]; p: bf16 in registers, or a shared-memory ref."""
    def run(acc_ref):
      plgpu.wgmma(acc_ref, p, k_smem.at[tile, half])
    return pl.run_state(run)(plgpu.ACC.init(acc))

  def consumer(half, body):
    """The step loop of consumer `half` (its O columns), then its half of the results."""
    def step(i, carry):
      acc, m_i, l_i = carry
      tile = lax.rem(i, NUM_K_TILES)
      s = body(i, tile)
      p, acc, m_i, l_i = mosaic_consumer.softmax_step(s, (chunk_lo + i) * BLOCK_KV, length,
                                                      acc, m_i, l_i)
      acc = pv(acc, p.astype(jnp.bfloat16), tile, half)
      plgpu.barrier_arrive(k_free.at[tile])  # this consumer's MMAs on the tile are done
      return acc, m_i, l_i

    write_half(*lax.fori_loop(0, steps, step, mosaic_consumer.initial_state()), half)

  def write_half(acc, m_i, l_i, half, via_smem=False):
    stage = None
    if via_smem and stage_output and num_splits == 1:
      stage = q_smem.at[half]
    mosaic_consumer.write_results(acc, m_i, l_i, half=half, seq=seq, row0=row0, split=split,
                                  num_splits=num_splits, sink_ref=sink_ref, out_ref=out_ref,
                                  lse_ref=lse_ref, stage_smem=stage)

  def issue_qk(acc_ref, tile):
    for h in range(2):
      plgpu.wgmma(acc_ref, q_smem.at[h], k_smem.at[tile, h].T)

  def publish(step, s):
    @pl.when(step > 0)
    def _wait_s_free():  # warpgroup 1 has read the previous S
      plgpu.barrier_wait(s_free)
    s_smem[:, pl.ds(0, BLOCK_KV)] = s
    plgpu.barrier_arrive(s_full)

  s_accumulator = plgpu.ACC((BLOCK_ROWS, BLOCK_KV), jnp.float32)

  def qk_ahead_loop(block, publish_scores=None):
    """Warpgroup 0's loop with block i + 1's QK in flight during block i's work,
    block(i, s, tile, acc, m, l) -> (acc, m, l) (its PV's wait covers that QK);
    publish_scores(i, s) first, when given. Returns the final (acc, m, l)."""
    def first_scores(acc_ref):
      wait_filled(0)  # filled even for an empty split
      issue_qk(acc_ref, 0)
      return acc_ref[...]

    def step(i, carry):
      acc, m_i, l_i, s = carry
      tile = lax.rem(i, NUM_K_TILES)
      if publish_scores is not None:
        publish_scores(i, s)
      following = lax.rem(i + 1, NUM_K_TILES)

      @pl.when(i + 1 < steps)
      def _wait_following():
        wait_filled(i + 1)

      def overlapped(s_ref):
        # After the last block this reads the other tile's stale block, which nothing
        # rewrites any more, and the result is dropped.
        issue_qk(s_ref, following)
        return (*block(i, s, tile, acc, m_i, l_i), s_ref[...])
      carry = pl.run_scoped(overlapped, s_accumulator)
      plgpu.barrier_arrive(k_free.at[tile])  # warpgroup 0's MMAs on the tile are done
      return carry

    s0 = pl.run_scoped(first_scores, s_accumulator)
    acc, m_i, l_i, _ = lax.fori_loop(0, steps, step, (*mosaic_consumer.initial_state(), s0))
    return acc, m_i, l_i

  def qk_ahead_consumer():
    """Warpgroup 0's "s_exchange_qk_ahead" loop: S published for warpgroup 1, then the
    softmax and PV with the next block's QK in flight."""
    def softmax_and_pv(i, s, tile, acc, m_i, l_i):
      p, acc, m_i, l_i = mosaic_consumer.softmax_step(s, (chunk_lo + i) * BLOCK_KV, length,
                                                      acc, m_i, l_i)
      return pv(acc, p.astype(jnp.bfloat16), tile, 0), m_i, l_i
    write_half(*qk_ahead_loop(softmax_and_pv, publish_scores=publish), 0)

  def softmax_for_both(ahead):
    """Warpgroup 0's loop with the "p_exchange" consumers: QK, the softmax, P and the row
    factors published for warpgroup 1, its own PV; m and l published at the end. ahead:
    block i + 1's QK is in flight during block i's softmax and PV."""

    def softmax_and_pv(i, s, tile, acc, m_i, l_i):
      p, alpha, m_i, l_i = mosaic_consumer.softmax_scores(s, (chunk_lo + i) * BLOCK_KV,
                                                          length, m_i, l_i)
      p = p.astype(jnp.bfloat16)

      @pl.when(i > 0)
      def _wait_p_free():  # warpgroup 1's PV of the previous block is done with P
        plgpu.barrier_wait(s_free)
      p_smem[...] = p
      rows_smem[0] = alpha
      plgpu.commit_smem()  # P, before warpgroup 1's wgmma reads it
      plgpu.barrier_arrive(s_full)
      acc = pv(mosaic_consumer.rescale(acc, alpha), p, tile, 0)
      return acc, m_i, l_i

    def step(i, carry):
      acc, m_i, l_i = carry
      tile = lax.rem(i, NUM_K_TILES)
      wait_filled(i)

      def qk(acc_ref):
        issue_qk(acc_ref, tile)
        return acc_ref[...]
      s = pl.run_scoped(qk, s_accumulator)
      acc, m_i, l_i = softmax_and_pv(i, s, tile, acc, m_i, l_i)
      plgpu.barrier_arrive(k_free.at[tile])  # warpgroup 0's MMAs on the tile are done
      return acc, m_i, l_i

    if ahead:
      acc, m_i, l_i = qk_ahead_loop(softmax_and_pv)
    else:
      acc, m_i, l_i = lax.fori_loop(0, steps, step, mosaic_consumer.initial_state())

    @pl.when(steps > 0)
    def _wait_last_p_free():  # warpgroup 1 read the last factors before they are replaced
      plgpu.barrier_wait(s_free)
    rows_smem[0] = m_i
    rows_smem[1] = l_i
    plgpu.barrier_arrive(ml_full)
    write_half(acc, m_i, l_i, 0, via_smem=True)

  def pv_from_shared_p():
    """Warpgroup 1's loop with the "p_exchange" consumers: rescale its half of O, then
    O += P V from shared memory; m and l from warpgroup 0 at the end."""
    row_layout = wgmma_layout.reduce(1)

    def step(i, acc):
      tile = lax.rem(i, NUM_K_TILES)
      if pair:  # see _pv_consumer's scores
        wait_filled(i)
      plgpu.barrier_wait(s_full)
      alpha = plgpu.load(rows_smem.at[0], (), layout=row_layout, optimized=False)
      acc = pv(mosaic_consumer.rescale(acc, alpha), p_smem, tile, 1)
      plgpu.barrier_arrive(s_free)  # P and the factors may be replaced
      plgpu.barrier_arrive(k_free.at[tile])
      return acc

    acc = lax.fori_loop(0, steps, step, mosaic_consumer.initial_state()[0])
    plgpu.barrier_wait(ml_full)
    m_i = plgpu.load(rows_smem.at[0], (), layout=row_layout, optimized=False)
    l_i = plgpu.load(rows_smem.at[1], (), layout=row_layout, optimized=False)
    write_half(acc, m_i, l_i, 1, via_smem=True)

  @pl.when(wg == 0)
  def _qk_consumer():
    set_registers(0)
    if inputs_in_kernel:
      mosaic_gather.gather_consecutive(q_ref, q_rope_ref, seq * rows + row0,
                                       jnp.clip(rows - row0, 0, BLOCK_ROWS), q_smem)
      plgpu.commit_smem()  # the stores, before this warpgroup's wgmma reads them
    else:
      for h in range(2):  # a TMA box is at most 256 elements along each dimension
        plgpu.copy_gmem_to_smem(q_ref.at[seq, pl.ds(row0, BLOCK_ROWS), pl.ds(h * HALF, HALF)],
                                q_smem.at[h], q_bar)
      plgpu.barrier_wait(q_bar)
    if p_exchange:
      softmax_for_both(ahead=qk_ahead)
      return
    if qk_ahead:
      qk_ahead_consumer()
      return

    def scores(step, tile):
      wait_filled(step)

      def qk(acc_ref):
        issue_qk(acc_ref, tile)
        return acc_ref[...]
      s = pl.run_scoped(qk, s_accumulator)
      publish(step, s)
      return s

    consumer(0, scores)

  @pl.when(wg == 1)
  def _pv_consumer():
    set_registers(1)
    if p_exchange:
      pv_from_shared_p()
      return

    def scores(step, tile):
      del tile
      if pair:  # complete already (warpgroup 0 waited before publishing S); observed here
        # too, so that this warpgroup's wgmma reads of the peer's st.async bytes follow it
        wait_filled(step)
      plgpu.barrier_wait(s_full)
      s = plgpu.load(s_smem.at[:, pl.ds(0, BLOCK_KV)], (), layout=wgmma_layout,
                     optimized=False)
      plgpu.barrier_arrive(s_free)
      return s

    consumer(1, scores)

  if pair:
    mosaic_pair.cluster_sync()
