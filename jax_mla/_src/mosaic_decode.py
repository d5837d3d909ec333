"""The fp8 MLA decode as a Pallas Mosaic GPU kernel (NVIDIA Hopper: wgmma, TMA, warpgroups).

EXPERIMENTAL, not wired into `jax_mla.decode`: it lowers on any machine (checked in CI) and
passes the oracle tests on an H200 (2026-12-02), but it is slower there than the Triton-lowered
kernel (benchmarks/NOTES-pallas.md has the figures).

One CTA per (sequence, block of 64 query rows, KV split) with three warpgroups:

- the producer (warpgroup 2) reads the KV indices of the next block of 64 entries and copies
  each gathered row into shared memory with two bulk copies: the 512-byte packed row (as 256
  16-bit words, scale and padding bytes included) and its 64 bf16 RoPE values. Two stages:
  block i + 1 is copied while block i is computed.
- the two consumers (warpgroups 0 and 1) each dequantize half of the block's 512 columns into
  one shared bf16 tile (the e8m0 tile scales are read from the staged rows), then both
  compute S = Q K^T over all 512 dims (computed twice, which keeps the softmax local to each
  warpgroup), the online softmax with the sink, and their half of O += P V (V is the same
  tile). The accumulator O [64, 256] f32 stays in registers.

The tile's columns are a fixed permutation of the latent's (`PERM`: the fp8 bytes are handled as
16-bit words, which give an even and an odd column); Q is permuted the same way by XLA and the
output is permuted back. With one split the kernel finalizes (sink, empty rows) and writes bf16
out and lse; with more it writes softmax-normalized f32 partials and their lse, merged by
`pallas_merge.merge_partials`. Lengths and indices are device values: one executable serves
every set of lengths.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from jax_mla._src import layout
from jax_mla._src import pallas_merge
from jax_mla._src import pallas_plan
from jax_mla._src.kernel_math import (LN2, LOG2E, SCORE_SCALE_LOG2, e8m0_to_f32, logaddexp2,
                                      split_chunks)

BLOCK_ROWS = 64  # query rows per CTA: one wgmma M tile
BLOCK_KV = 64  # KV entries per step
HALF = layout.HEAD_DIM // 2  # output columns per consumer warpgroup
SCALE_WORD = layout.SCALE_OFFSET // 2  # the 16-bit word holding byte 448 (tile 0's scale)
TILE = layout.TILE


@dataclasses.dataclass(frozen=True)
class MosaicConfig:
  """num_stages: raw-row buffers (copies of this many blocks in flight)."""
  num_stages: int = 2
  min_split_entries: int = 256
  # True: the row copies promise to stay in bounds (the indices are clamped), which makes Mosaic
  # issue plain contiguous bulk copies (cp.async.bulk, no tensor map); False: tensor-map TMAs.
  bulk_copies: bool = True
  # The producer reads this many KV indices from global memory before issuing their copies, so
  # the index loads overlap instead of each waiting behind the previous copies (1: one by one).
  index_group: int = 16
  # False: rows staged as 16-bit words, decoded to fp8 values with integer operations, latent
  # columns permuted (PERM). True: rows staged as bytes (one 512-byte bulk copy), each 64-column
  # tile loaded as fp8 and converted by the hardware (cvt e4m3x2 -> f16x2), no permutation.
  # Written to measure the dequantization's cost; lowers, never run on a GPU (2026-12-02).
  fp8_bytes: bool = False
  # A diagnostic: with both set, every warpgroup records its named regions (the scopes in the
  # kernel: waits, dequantize, qk, softmax, pv, issue) for up to profile_steps steps of 64
  # entries into a Mosaic GPU profiler trace, written to profile_dir as JSON
  # (benchmarks/mosaic_profile.py summarizes it). The records are staged in shared memory,
  # 16 bytes per region per warpgroup, which bounds profile_steps to about 40.
  profile_dir: str = ""
  profile_steps: int = 0


def _plgpu():
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  return plgpu


def _permutation():
  """K/Q column order inside the kernel: position p holds latent column PERM[p].

  The fp8 bytes are staged and loaded as 16-bit words, so a word yields an even and an odd
  column. (Words were chosen when 8-bit loads seemed to give wrong data on the H200; the fault
  was the global scale load, 2026-12-02. `MosaicConfig.fp8_bytes` stages bytes instead.)
  Each 128-byte chunk c < 3 becomes [its 64 even columns, its 64 odd columns]; the last 64
  NoPE bytes (384..447) become [32 even, 32 odd]; the RoPE stays at 448..511. Q is permuted
  the same way (so QK is unchanged) and the output is permuted back."""
  perm = []
  for c in range(3):
    perm += [128 * c + 2 * k for k in range(64)] + [128 * c + 2 * k + 1 for k in range(64)]
  perm += [384 + 2 * k for k in range(32)] + [385 + 2 * k for k in range(32)]
  perm += list(range(layout.NOPE_DIM, layout.HEAD_DIM))
  perm = np.asarray(perm, np.int32)
  assert sorted(perm.tolist()) == list(range(layout.HEAD_DIM))
  return perm, np.argsort(perm).astype(np.int32)


PERM, INV_PERM = _permutation()


def _decode_e4m3(b):
  """fp8 e4m3fn byte values (int32 0..255) -> f32 with integer ops, exactly: sign, 4-bit
  exponent (bias 7), 3-bit mantissa; exponent 0 is subnormal (m * 2^-9); 0x7F, 0xFF are NaN."""
  sign = jnp.where(b >= 128, -1.0, 1.0).astype(jnp.float32)
  e = lax.shift_right_logical(b, 3) & 15
  m = b & 7
  normal = lax.bitcast_convert_type(lax.shift_left(e + 120, 23) | lax.shift_left(m, 20),
                                    jnp.float32)
  sub = m.astype(jnp.float32) * jnp.float32(2.0**-9)
  vals = sign * jnp.where(e == 0, sub, normal)
  return jnp.where((b & 127) == 127, jnp.float32(jnp.nan), vals)


def _kernel(indptr_ref, idx_ref, q_ref, kv_ref, rope_ref, sink_ref, out_ref, lse_ref,
            q_smem, k_smem, raw_smem, rope_smem,
            q_bar, full_bars, free_bars, k_ready_bar, k_free_bar,
            *, num_splits, num_stages, num_indices, bulk_copies, index_group, fp8_bytes):
  plgpu = _plgpu()
  oob_mode = (plgpu.OOBFillMode.PROMISE_IN_BOUNDS if bulk_copies else plgpu.OOBFillMode.ZEROS)
  seq = lax.axis_index("seq")
  row_block = lax.axis_index("rows")
  split = lax.axis_index("split")
  wg = lax.axis_index("wg")
  row0 = row_block * BLOCK_ROWS

  start = indptr_ref[seq]
  length, chunk_lo, chunk_hi = split_chunks(start, indptr_ref[seq + 1], split, num_splits,
                                            BLOCK_KV)
  steps = chunk_hi - chunk_lo

  @pl.when(wg == 2)
  def _producer():
    plgpu.set_max_registers(56, action="decrease")

    @pl.loop(0, steps)
    def _fill(step):
      slot = lax.rem(step, num_stages)

      @pl.when(step >= num_stages)
      def _wait_free():
        with jax.named_scope("free_wait"):
          plgpu.barrier_wait(free_bars.at[slot])

      base = start + (chunk_lo + step) * BLOCK_KV
      bar = full_bars.at[slot]
      copy = functools.partial(plgpu.copy_gmem_to_smem, barrier=bar, oob_mode=oob_mode)
      with jax.named_scope("issue"):
        for first in range(0, BLOCK_KV, index_group):
          entries = range(first, min(first + index_group, BLOCK_KV))
          rows = [idx_ref[jnp.minimum(base + j, num_indices - 1)] for j in entries]
          for j, row in zip(entries, rows):
            # One row: its 256 words (scales and padding come along, never used) and the RoPE.
            copy(kv_ref.at[pl.ds(row, 1)], raw_smem.at[slot, pl.ds(j, 1)])
            copy(rope_ref.at[pl.ds(row, 1)], rope_smem.at[slot, pl.ds(j, 1)])

  @pl.when(wg < 2)
  def _consumer():
    plgpu.set_max_registers(224, action="increase")
    # Each consumer copies one half (a TMA box is at most 256 elements along each dimension).
    plgpu.copy_gmem_to_smem(q_ref.at[seq, pl.ds(row0, BLOCK_ROWS), pl.ds(wg * HALF, HALF)],
                            q_smem.at[wg], q_bar)
    plgpu.barrier_wait(q_bar)
    wgmma_layout = plgpu.Layout.WGMMA
    row_layout = wgmma_layout.reduce(1)

    def body(step, carry):
      acc, m_i, l_i = carry
      slot = lax.rem(step, num_stages)
      with jax.named_scope("rows_wait"):
        plgpu.barrier_wait(full_bars.at[slot])
      base_entry = (chunk_lo + step) * BLOCK_KV

      def raw_words(first, width):
        """The staged rows' 16-bit words first .. first + width - 1: a [64, width] ref."""
        return raw_smem.at[slot, :, pl.ds(first, width)]

      def tile_scales(tiles):
        """{t: f32 [64] row vector} for the given tiles of this block's rows.

        Bytes 448..463 of the rows are in shared memory with them: tile t's scale is byte
        448 + 2t, which is byte 2t of them, or the low byte of their word t (words 224..231).
        The padding bytes among them are loaded, never used."""
        if fp8_bytes:
          ref, col_of = raw_smem.at[slot, :, pl.ds(layout.SCALE_OFFSET, 16)], lambda t: 2 * t
        else:
          ref, col_of = raw_words(SCALE_WORD, 8), lambda t: t
        low = plgpu.load(ref, (), layout=wgmma_layout, optimized=False).astype(jnp.int32) & 255
        col = plgpu.broadcasted_iota(jnp.int32, (BLOCK_KV, ref.shape[-1]), 1,
                                     layout=wgmma_layout)
        return {t: e8m0_to_f32(jnp.where(col == col_of(t), low, 0).sum(axis=1)) for t in tiles}

      def valid_mask(width):
        entry = plgpu.broadcasted_iota(jnp.int32, (BLOCK_KV, width), 0, layout=wgmma_layout)
        return entry + base_entry < length

      def word_chunk(first_word, width, scale_lo, scale_hi):
        """`width` 16-bit words from word `first_word` -> (even, odd) bf16 columns [64, width],
        scaled (words < 32 of the chunk use scale_lo, the rest scale_hi), invalid lanes 0."""
        words = plgpu.load(raw_words(first_word, width), (), layout=wgmma_layout,
                           optimized=False)
        words = words.astype(jnp.int32) & 0xFFFF
        col = plgpu.broadcasted_iota(jnp.int32, (BLOCK_KV, width), 1, layout=wgmma_layout)
        bcast = lambda v: lax.broadcast_in_dim(v, (BLOCK_KV, width), [0])
        scale = jnp.where(col < 32, bcast(scale_lo), bcast(scale_hi))
        ok = valid_mask(width)
        return [jnp.where(ok, _decode_e4m3(b) * scale, 0.0).astype(jnp.bfloat16)
                for b in (words & 255, lax.shift_right_logical(words, 8))]

      def byte_tile(t, scale):
        """Tile t's 64 fp8 columns of the block's rows -> bf16 [64, 64], scaled, invalid rows 0."""
        raw = plgpu.load(raw_smem.at[slot, :, pl.ds(TILE * t, TILE)], (), layout=wgmma_layout,
                         optimized=False)
        vals = lax.bitcast_convert_type(raw, jnp.float8_e4m3fn).astype(jnp.float32)
        vals = vals * lax.broadcast_in_dim(scale, (BLOCK_KV, TILE), [0])
        return jnp.where(valid_mask(TILE), vals, 0.0).astype(jnp.bfloat16)

      @pl.when(step > 0)
      def _wait_k_free():  # both consumers are done with the previous tile
        with jax.named_scope("k_free_wait"):
          plgpu.barrier_wait(k_free_bar)

      @pl.when(wg == 0)
      @jax.named_scope("dequantize")
      def _dequantize_first_half():  # latent columns 0..255: chunks 0 and 1
        scale = tile_scales(range(4))
        if fp8_bytes:
          for t in range(4):
            k_smem[0, :, pl.ds(TILE * t, TILE)] = byte_tile(t, scale[t])
          return
        for c in range(2):
          even, odd = word_chunk(64 * c, 64, scale[2 * c], scale[2 * c + 1])
          k_smem[0, :, pl.ds(128 * c, 64)] = even
          k_smem[0, :, pl.ds(128 * c + 64, 64)] = odd

      @pl.when(wg == 1)
      @jax.named_scope("dequantize")
      def _dequantize_second_half():  # chunk 2, NoPE bytes 384..447, the RoPE
        scale = tile_scales(range(4, layout.NUM_TILES))
        if fp8_bytes:
          for t in range(4, layout.NUM_TILES):
            k_smem[1, :, pl.ds(TILE * (t - 4), TILE)] = byte_tile(t, scale[t])
        else:
          even, odd = word_chunk(128, 64, scale[4], scale[5])
          k_smem[1, :, pl.ds(0, 64)] = even
          k_smem[1, :, pl.ds(64, 64)] = odd
          even, odd = word_chunk(192, 32, scale[6], scale[6])
          k_smem[1, :, pl.ds(128, 32)] = even
          k_smem[1, :, pl.ds(160, 32)] = odd
        rope = plgpu.load(rope_smem.at[slot], (), layout=wgmma_layout, optimized=False)
        k_smem[1, :, pl.ds(192, 64)] = jnp.where(valid_mask(64), rope, jnp.zeros_like(rope))

      plgpu.barrier_arrive(free_bars.at[slot])  # the raw slot may be refilled
      plgpu.commit_smem()  # the generic-proxy stores, before wgmma reads them
      plgpu.barrier_arrive(k_ready_bar)
      with jax.named_scope("k_ready_wait"):
        plgpu.barrier_wait(k_ready_bar)

      def qk(acc_ref):
        for h in range(2):
          plgpu.wgmma(acc_ref, q_smem.at[h], plgpu.transpose_ref(k_smem.at[h], (1, 0)))
        return acc_ref[...]

      with jax.named_scope("qk"):
        s = pl.run_scoped(qk, plgpu.ACC((BLOCK_ROWS, BLOCK_KV), jnp.float32))
      with jax.named_scope("softmax"):
        entry = plgpu.broadcasted_iota(jnp.int32, (BLOCK_ROWS, BLOCK_KV), 1,
                                       layout=wgmma_layout)
        s = jnp.where(entry + base_entry < length, s * SCORE_SCALE_LOG2, -jnp.inf)
        m_new = jnp.maximum(m_i, s.max(axis=1))  # finite: every block has a valid entry
        alpha = jnp.exp2(m_i - m_new)
        p = jnp.exp2(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
        l_i = l_i * alpha + p.sum(axis=1)
        acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])

      def pv(acc_ref):
        plgpu.wgmma(acc_ref, p.astype(jnp.bfloat16), k_smem.at[wg])

      with jax.named_scope("pv"):
        acc = pl.run_state(pv)(plgpu.ACC.init(acc))
      plgpu.barrier_arrive(k_free_bar)
      return acc, m_new, l_i

    acc = plgpu.layout_cast(jnp.zeros((BLOCK_ROWS, HALF), jnp.float32), wgmma_layout)
    m_i = plgpu.layout_cast(jnp.full((BLOCK_ROWS,), -jnp.inf, jnp.float32), row_layout)
    l_i = plgpu.layout_cast(jnp.zeros((BLOCK_ROWS,), jnp.float32), row_layout)
    acc, m_i, l_i = lax.fori_loop(0, steps, body, (acc, m_i, l_i))

    seen = l_i != 0  # NaN (a NaN scale in the row's data) counts as seen, so it propagates
    m_safe = jnp.where(seen, m_i, 0.0)
    lse2 = jnp.where(seen, m_safe + jnp.log2(jnp.where(seen, l_i, 1.0)), -jnp.inf)
    cols = pl.ds(wg * HALF, HALF)
    if num_splits == 1:
      sink2 = plgpu.load(sink_ref, pl.ds(row0, BLOCK_ROWS), layout=row_layout,
                         optimized=False) * LOG2E
      total2 = logaddexp2(lse2, sink2)
      # out = acc * 2^(m - total): a +inf sink gives 0; empty rows are selected to 0.
      weight = jnp.where(seen, jnp.exp2(m_safe - total2), 0.0)
      out = acc * lax.broadcast_in_dim(weight, acc.shape, [0])
      out_ref[seq, pl.ds(row0, BLOCK_ROWS), cols] = out.astype(out_ref.dtype)

      @pl.when(wg == 0)
      def _lse():
        lse_ref[seq, pl.ds(row0, BLOCK_ROWS)] = total2 * LN2
    else:
      inv_l = jnp.where(seen, 1.0 / jnp.where(seen, l_i, 1.0), 0.0)
      out_ref[seq, split, pl.ds(row0, BLOCK_ROWS), cols] = (
          acc * lax.broadcast_in_dim(inv_l, acc.shape, [0]))

      @pl.when(wg == 0)
      def _lse():
        lse_ref[seq, split, pl.ds(row0, BLOCK_ROWS)] = lse2 * LN2


# Named regions a warpgroup enters per step (the consumers' seven).
_REGIONS_PER_STEP = 7


def _profiler_params(config):
  """Mosaic GPU compiler parameters: room for the profiler's records when profiling is on."""
  if bool(config.profile_dir) != bool(config.profile_steps):
    raise ValueError("MosaicConfig.profile_dir and profile_steps are set together or not at all")
  if not config.profile_dir:
    return None
  # profile_space counts regions per warpgroup; a few more for the regions outside the loop.
  return _plgpu().CompilerParams(profile_space=_REGIONS_PER_STEP * config.profile_steps + 4,
                                 profile_dir=config.profile_dir)


def mosaic_decode(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, *, tokens_per_seq: int,
                  num_kv_splits_: int | None = None, return_lse: bool = True,
                  config: MosaicConfig | None = None):
  """Decode with the Mosaic GPU kernel; arguments as `pallas_decode.pallas_decode`."""
  plgpu = _plgpu()
  config = config or MosaicConfig()
  if not 1 <= config.index_group <= BLOCK_KV:
    raise ValueError(f"MosaicConfig.index_group must be in 1..{BLOCK_KV}, "
                     f"got {config.index_group!r}")
  if config.fp8_bytes and not config.bulk_copies:
    raise ValueError("MosaicConfig.fp8_bytes needs bulk_copies: a tensor-map copy moves at most "
                     "256 elements per dimension, a packed row is 512 bytes")
  compiler_params = _profiler_params(config)
  num_tokens, num_heads = q.shape[:2]
  num_seqs = kv_indptr.shape[0] - 1
  rows = tokens_per_seq * num_heads
  padded_rows = -(-rows // BLOCK_ROWS) * BLOCK_ROWS
  row_blocks = padded_rows // BLOCK_ROWS
  num_indices = max(kv_indices.shape[0], 1)
  splits = num_kv_splits_ or pallas_plan.num_kv_splits(
      num_seqs, row_blocks, num_indices, BLOCK_KV, min_entries=config.min_split_entries)

  q3 = q.reshape(num_seqs, rows, layout.ROW_BYTES)
  q_rope3 = q_rope.reshape(num_seqs, rows, layout.ROPE_DIM)
  q_bf16 = layout.unpack_rows(q3, q_rope3, jnp.bfloat16)
  if not config.fp8_bytes:
    q_bf16 = q_bf16[..., PERM]
  q_bf16 = jnp.pad(q_bf16, ((0, 0), (0, padded_rows - rows), (0, 0)))
  sink_rows = pallas_plan.sink_rows(sink, tokens_per_seq, padded_rows)
  # A block's 64 entries past any start stay inside the list (padded with row 0, clamped into
  # the pool): the copies past a sequence's end read real rows, which the length mask drops.
  num_padded = -(-(num_indices + BLOCK_KV) // BLOCK_KV) * BLOCK_KV
  indices = jnp.pad(kv_indices.astype(jnp.int32), (0, num_padded - kv_indices.shape[0]))
  indices = jnp.clip(indices, 0, kv.shape[0] - 1)
  # The rows as the kernel stages them: bytes, or 256 little-endian 16-bit words each (a
  # reinterpretation, no copy).
  staged_kv = kv if config.fp8_bytes else lax.bitcast_convert_type(
      kv.reshape(kv.shape[0], layout.ROW_BYTES // 2, 2), jnp.uint16)

  # 64-byte swizzle (tiles of 8 x 32 bf16): the 32-column pieces of the permuted K are whole
  # tiles.
  swizzled = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(64))
  stages = config.num_stages
  scratch = dict(
      # Column halves [2, rows, 256]: each is one TMA box, one consumer's PV operand.
      q_smem=plgpu.SMEM((2, BLOCK_ROWS, HALF), jnp.bfloat16, transforms=swizzled),
      k_smem=plgpu.SMEM((2, BLOCK_KV, HALF), jnp.bfloat16, transforms=swizzled),
      raw_smem=(plgpu.SMEM((stages, BLOCK_KV, layout.ROW_BYTES), jnp.uint8) if config.fp8_bytes
                else plgpu.SMEM((stages, BLOCK_KV, layout.ROW_BYTES // 2), jnp.uint16)),
      rope_smem=plgpu.SMEM((stages, BLOCK_KV, layout.ROPE_DIM), jnp.bfloat16),
      q_bar=plgpu.Barrier(num_arrivals=2),
      # One arrival per copy: the row's and the RoPE's, per entry.
      full_bars=plgpu.Barrier(num_arrivals=2 * BLOCK_KV, num_barriers=stages),
      free_bars=plgpu.Barrier(num_arrivals=2, num_barriers=stages),
      k_ready_bar=plgpu.Barrier(num_arrivals=2),
      k_free_bar=plgpu.Barrier(num_arrivals=2),
  )
  kernel = functools.partial(_kernel, num_splits=splits, num_stages=stages,
                             num_indices=num_padded, bulk_copies=config.bulk_copies,
                             index_group=config.index_group, fp8_bytes=config.fp8_bytes)
  results = plgpu.kernel(
      kernel, out_type=pallas_plan.result_types(num_seqs, splits, padded_rows),
      scratch_types=scratch,
      compiler_params=compiler_params,
      grid=(num_seqs, row_blocks, splits), grid_names=("seq", "rows", "split"),
      num_threads=3, thread_name="wg",
  )(kv_indptr.astype(jnp.int32), indices, q_bf16,
    staged_kv, kv_rope, sink_rows)
  out, lse = pallas_merge.finish(results, splits, sink_rows, rows=rows, num_tokens=num_tokens,
                                 num_heads=num_heads,
                                 columns=None if config.fp8_bytes else INV_PERM)
  return out, (lse if return_lse else None)
