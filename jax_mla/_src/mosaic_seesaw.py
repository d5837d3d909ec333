"""The direct design's consumers in FlashMLA's "seesaw" order (MosaicConfig.seesaw).

In the default order warpgroup 0 computes every block's S = Q K^T and both warpgroups run the
softmax, so warpgroup 0 does twice warpgroup 1's tensor-core work and its QK, softmax and PV
form one chain per block. Here the two warpgroups take the blocks in pairs (a = 2k in K tile
0, b = 2k + 1 in K tile 1) and each computes one QK per pair:

- warpgroup 0: S_a, the softmax of block a from the running (m, l), P_a and its factors into
  shared memory, O[:, :256] = O alpha + P_a V_a; then, from warpgroup 1's P_b and factors,
  O = O beta + P_b V_b.
- warpgroup 1: S_b (computed while it waits for P_a), O[:, 256:] = O alpha + P_a V_a, the
  softmax of block b from warpgroup 0's (m_a, l_a), P_b and its factors into shared memory,
  O = O beta + P_b V_b.

The operations are those of two sequential online-softmax steps, so the result equals the
default order's; both warpgroups end every pair with the same m and l (warpgroup 0 reads
warpgroup 1's). A split with an odd number of blocks pairs its last block with one past the
split's end: the producer fills it with zeros without reading indices, and the mask
(entries at or past `limit`, the split's end) gives it no weight.

On the H200 (2026-12-03) it passes the GPU tests of tests/test_mosaic.py and is much slower
than the default order: 495.5 against 296.9 us at 128 heads, B 128, K 2048, with ptxas
spilling 1272 bytes (both warpgroups hold S, P and half of O, and warpgroup 1 its S
accumulator while its PV of P_a runs).

Shared memory besides the direct design's Q and K tiles: P_a and P_b (bf16, wgmma operands),
and six rows of factors (alpha, m_a, l_a from warpgroup 0; beta, m_b, l_b from warpgroup 1).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jax_mla._src import mosaic_consumer
from jax_mla._src.mosaic_consumer import BLOCK_KV, BLOCK_ROWS

# Both consumers hold S, P and half of O; the producer keeps what the default split gave it.
REGISTERS = {0: 200, 1: 192, 2: 112}
# rows_smem's rows: warpgroup 0's factors of block a, then warpgroup 1's of block b.
ALPHA, M_A, L_A, BETA, M_B, L_B = range(6)


def scratch_types():
  """The seesaw's shared memory and barriers, beside the direct design's Q and K tiles."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  from jax_mla._src import mosaic_gather  # pylint: disable=import-outside-toplevel
  p_tile = plgpu.SMEM((BLOCK_ROWS, BLOCK_KV), jnp.bfloat16,
                      transforms=mosaic_gather.k_tile_transforms())
  # Two refs, not one indexed by slot: a Python-int index of a ref that a wgmma's run_state
  # closes over became a literal result of the run_state, which Mosaic's warpgroup lowering
  # rejected (jax 0.11.2, on the H200).
  return dict(
      p_a_smem=p_tile, p_b_smem=p_tile,
      rows_smem=plgpu.SMEM((6, BLOCK_ROWS), jnp.float32),
      # p_full[j]: P of pair slot j (0: a, 1: b) and its factors are published;
      # p_free[j]: the other warpgroup's PV with it is done.
      p_full=plgpu.Barrier(num_arrivals=1, num_barriers=2),
      p_free=plgpu.Barrier(num_arrivals=1, num_barriers=2),
  )


def num_pairs(steps):
  """Block pairs of a split of `steps` blocks (>= 0)."""
  return lax.div(steps + 1, 2)


def consumer(half, *, k_smem, p_smems, rows_smem, p_full, p_free, k_free, steps, chunk_lo,
             limit, pair, wait_filled, issue_qk, pv, write_half):
  """Warpgroup `half`'s loop over the split's block pairs, then its half of the results.

  wait_filled(step), issue_qk(acc_ref, tile), pv(acc, p, tile, half) and write_half(acc, m,
  l, half) are the direct kernel's; p_smems: the P tiles of blocks a and b; limit: the
  split's end as an entry count past which every entry is masked. pair (mosaic_pair): each
  warpgroup also observes the fill of the tile the other scored before its wgmma reads it,
  so that those reads follow the peer CTA's st.async bytes."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  row_layout = plgpu.Layout.WGMMA.reduce(1)
  s_accumulator = plgpu.ACC((BLOCK_ROWS, BLOCK_KV), jnp.float32)
  mine, theirs = half, 1 - half  # the pair slot (and K tile) this warpgroup scores

  def load_row(r):
    return plgpu.load(rows_smem.at[r], (), layout=row_layout, optimized=False)

  def publish(k, p, factors):
    """P (bf16) and its factors into this warpgroup's slot, once the other warpgroup's PV
    of the previous pair is done with them."""
    @pl.when(k > 0)
    def _wait_free():
      plgpu.barrier_wait(p_free.at[mine])
    p_smems[mine][...] = p
    for r, v in zip((ALPHA, M_A, L_A) if half == 0 else (BETA, M_B, L_B), factors):
      rows_smem[r] = v
    plgpu.commit_smem()  # P, before the other warpgroup's wgmma reads it
    plgpu.barrier_arrive(p_full.at[mine])

  def softmax(s, block, m_i, l_i):
    p, factor, m_new, l_new = mosaic_consumer.softmax_scores(
        s, (chunk_lo + block) * BLOCK_KV, limit, m_i, l_i)
    return p.astype(jnp.bfloat16), factor, m_new, l_new

  def first_half_pair(k, carry):
    acc, m_i, l_i = carry
    wait_filled(2 * k)

    def qk(s_ref):
      issue_qk(s_ref, 0)
      return s_ref[...]
    s = pl.run_scoped(qk, s_accumulator)
    p, alpha, m_a, l_a = softmax(s, 2 * k, m_i, l_i)
    publish(k, p, (alpha, m_a, l_a))

    def pv_a(acc_ref):  # runs while this warpgroup waits for P_b
      plgpu.wgmma(acc_ref, p, k_smem.at[0, half])
      plgpu.barrier_wait(p_full.at[theirs])
    acc = pl.run_state(pv_a)(plgpu.ACC.init(mosaic_consumer.rescale(acc, alpha)))
    plgpu.barrier_arrive(k_free.at[0])
    beta, m_b, l_b = load_row(BETA), load_row(M_B), load_row(L_B)
    if pair:
      wait_filled(2 * k + 1)
    acc = pv(mosaic_consumer.rescale(acc, beta), p_smems[theirs], 1, half)
    plgpu.barrier_arrive(p_free.at[theirs])
    plgpu.barrier_arrive(k_free.at[1])
    return acc, m_b, l_b

  def second_half_pair(k, carry):
    acc, _, _ = carry  # m and l come from warpgroup 0's block a
    wait_filled(2 * k + 1)

    def qk_and_pv_a(s_ref):  # S_b runs while this warpgroup waits for P_a
      issue_qk(s_ref, 1)
      plgpu.barrier_wait(p_full.at[theirs])
      alpha, m_a, l_a = load_row(ALPHA), load_row(M_A), load_row(L_A)
      if pair:
        wait_filled(2 * k)
      acc_ = pv(mosaic_consumer.rescale(acc, alpha), p_smems[theirs], 0, half)
      return acc_, m_a, l_a, s_ref[...]
    acc, m_a, l_a, s = pl.run_scoped(qk_and_pv_a, s_accumulator)
    plgpu.barrier_arrive(p_free.at[theirs])
    plgpu.barrier_arrive(k_free.at[0])
    p, beta, m_b, l_b = softmax(s, 2 * k + 1, m_a, l_a)
    publish(k, p, (beta, m_b, l_b))
    acc = pv(mosaic_consumer.rescale(acc, beta), p, 1, half)
    plgpu.barrier_arrive(k_free.at[1])
    return acc, m_b, l_b

  pair_step = first_half_pair if half == 0 else second_half_pair
  acc, m_i, l_i = lax.fori_loop(0, num_pairs(steps), pair_step,
                                mosaic_consumer.initial_state())
  write_half(acc, m_i, l_i, half)
