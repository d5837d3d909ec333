"""The fp8 MLA decode as a Pallas Mosaic GPU kernel (NVIDIA Hopper: wgmma, TMA, warpgroups).

EXPERIMENTAL, not wired into `jax_mla.decode`: it lowers on any machine (checked in CI) and
passes the oracle tests on an H200; benchmarks/NOTES-pallas.md has its speed.

One CTA per (sequence, block of 64 query rows, KV split) with three warpgroups, in one of two
designs (MosaicConfig.design). The default, "direct", is mosaic_direct's: the producer gathers
and dequantizes rows from global memory itself (mosaic_gather) into two K tiles. The first,
"staged", is this module's kernel:

- the producer (warpgroup 2) reads the KV indices of the next block of 64 entries (each of its
  four warps 16 of them) and copies each gathered row into shared memory with two bulk copies:
  its 512 packed bytes (fp8 values, tile scales, padding never used) and its 64 bf16 RoPE
  values. Two stages: block i + 1 is copied while block i is computed.
- the two consumers (warpgroups 0 and 1) each dequantize half of the block's 512 columns
  (consumer 0: tiles 0-3; consumer 1: tiles 4-6 and the RoPE) into one shared bf16 tile, with
  the hardware fp8 conversion; each computes S = Q K^T over all 512 dims for 32 of the 64
  entries and they exchange the halves through shared memory; then each runs the online
  softmax with the sink and its half of O += P V (V is the same tile). The accumulator
  O [64, 256] f32 stays in registers.

With one split the kernel finalizes (sink, empty rows) and writes bf16 out and lse; with more it
writes softmax-normalized f32 partials and their lse, merged by `pallas_merge.merge_partials`.
Lengths and indices are device values: one executable serves every set of lengths.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jax_mla._src import layout
from jax_mla._src import mosaic_consumer
from jax_mla._src import mosaic_direct
from jax_mla._src import mosaic_gather
from jax_mla._src import pallas_merge
from jax_mla._src import pallas_plan
from jax_mla._src.kernel_math import e8m0_to_f32, split_chunks
from jax_mla._src.mosaic_consumer import BLOCK_KV, BLOCK_ROWS, HALF, LAUNCH_REGISTERS

TILE = layout.TILE
INDEX_GROUP = 16  # KV indices the producer reads before issuing their copies
# MosaicConfig.dequant_layout -> the plgpu.Layout the dequantization loads the staged rows in.
DEQUANT_LAYOUTS = {"wgmma": "WGMMA", "upcast": "WGMMA_UPCAST_4X"}


DESIGNS = ("direct", "staged")


@dataclasses.dataclass(frozen=True)
class MosaicConfig:
  """num_stages: raw-row buffers (copies of this many blocks in flight)."""
  # "direct": mosaic_direct's kernel (the producer gathers and dequantizes from global memory
  # into two K tiles), which uses only min_split_entries, split_rule, approx_math and the
  # fields from s_padding to direct_registers below. "staged": this
  # module's (rows bulk-copied into shared memory, both consumers dequantize), which uses the
  # others (and profiling, which only it supports). On the H200
  # (2026-12-03) "direct" was 13-22% faster at batch 64 and 128 over 128 heads, 64 heads and
  # 16 x 4 (e.g. 330.9 against 420.6 us at 128 heads, B 128, K 2048) and within 8% either way
  # at batch 1.
  design: str = "direct"
  # The direct design's S exchange (the "s_exchange" consumers): f32 columns of padding after
  # each of S's 64 in shared memory. Unpadded, the eight rows a wgmma-layout store or load
  # touches at once all start on the same bank (8-way conflicts); 8 columns put four rows on
  # distinct banks per half-warp of 8-byte accesses: 325.5 us against 338.4 at 128 heads,
  # B 128, K 2048.
  s_padding: int = 8
  # The direct design's division of each block's work between its two consumer warpgroups
  # (mosaic_direct.CONSUMERS); None: "p_exchange". On the H200 (2026-12-03, 128 heads, K
  # 2048, B 128; each pair of numbers from one run): "p_exchange" 277.0 against 296.9 us for
  # "s_exchange"; "s_exchange_qk_ahead" 443.8 against 330.1 for "s_exchange" (an earlier
  # register split; ptxas serialized its wgmmas, C7512 and C7519); "seesaw" 495.5 against
  # 296.9 (ptxas spilled 1272 bytes); "p_exchange_qk_ahead" 381.2 against 249.5 for
  # "p_exchange" (ptxas spilled 68 bytes).
  consumers: str | None = None
  # The direct design reads the packed fp8 Q and the raw index list itself: no XLA passes
  # before the kernel (Q's dequantization and padding, the indices' padding and clamping).
  # None: on, except with the "seesaw" consumers (which do not support it). Measured as GPU
  # busy time per call (gpu_decode.py --timing profiler; H200, 2026-12-03, 128 heads) it was
  # faster at every shape: 39.5 against 46.4 us at B 64, K 512; 76.2 against 88.3 at B 128,
  # K 512; 216.9 against 229.6 at B 128, K 2048; 14.6 against 15.4 at B 1, K 512 (the XLA
  # passes took 5.8-10.5 us at B 64-128). (Host-clock loops had hidden that behind the loop's
  # own gaps.)
  inputs_in_kernel: bool | None = None
  # The direct design pairs the CTAs of row blocks 2j and 2j + 1 (128 heads: both blocks of a
  # sequence) in a cluster, and each gathers and dequantizes half of every KV block into both
  # (mosaic_pair). Without it both gather every row. Ignored when the row blocks are odd in
  # number. None: on. On the H200 (2026-12-03, 128 heads, K 2048) with "p_exchange": 246.8
  # against 277.0 us at B 128, 136.4 against 150.3 at B 64; with "s_exchange" and an earlier
  # register split it was slower (352.6 against 330.1 at B 128).
  pair_row_blocks: bool | None = None
  # The direct design with the "p_exchange" consumers: with one split, each consumer writes
  # its half of the bf16 output through shared memory and one TMA copy, instead of storing
  # its register fragments straight to global memory. None: on with "p_exchange" consumers
  # (True with others raises). GPU busy time per call on the H200 (2026-12-03, 128 heads,
  # gpu_decode.py --timing profiler, side by side): 33.8 against 39.2 us at B 64, K 512; 66.2
  # against 76.4 at B 128, K 512; 209.0 against 218.3 at B 128, K 2048; at batch 1 (several
  # splits: f32 partials, stored as before) within 0.2 us.
  stage_output: bool | None = None
  # stage_output for the f32 partials of several splits (batch 1 and other small batches):
  # each consumer's partial goes through an f32 tile laid over the K tiles, which are dead by
  # then, and one TMA copy. Needs the "p_exchange" consumers. Lowers on the CPU; not yet run
  # on a GPU (2026-12-03), so off.
  stage_partials: bool = False
  # The direct design's registers per thread of warpgroups 0, 1 and 2 after `setmaxnreg`
  # (multiples of 8 in 24..256, summing to at most LAUNCH_REGISTERS); None: mosaic_direct's
  # REGISTERS for the consumers.
  direct_registers: tuple[int, int, int] | None = None
  num_stages: int = 2
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
  # The register layout the dequantization loads the staged rows in: "upcast"
  # (WGMMA_UPCAST_4X: 8 consecutive columns per thread, 8-byte loads, 16-byte stores) or "wgmma"
  # (2 columns per thread, 2-byte loads; 15-20% slower on the H200, 2026-12-02). Both conflict
  # 8-way on the shared-memory banks (every staged row starts on bank 0); padding the rows to
  # remove that faulted on the GPU (tools/mosaic_probe.py).
  dequant_layout: str = "upcast"
  # split_qk: consumer c computes S only for the block's entries 32c .. 32c + 31 (over all 512
  # dims) and the two halves are exchanged through 16 KB of shared memory, so QK is computed
  # once instead of twice. False computes all of S in both consumers.
  split_qk: bool = True
  # producer_warps: each of the producer's four warps issues the copies of 16 of a block's 64
  # entries (Mosaic issues a copy from one elected thread: one warpgroup issues all 128 one
  # after another). Its regions are not profiled. On the H200 (2026-12-02, B 128, K 2048)
  # both on: 434 us, split_qk alone 461, producer_warps alone 443, neither 467.
  producer_warps: bool = True
  # approx_math: the softmax's exp2 and the lse's log2 use the hardware approximations
  # (ex2.approx, lg2.approx: relative error about 2^-22, far below bf16's). 3% faster on the
  # H200 (2026-12-02, B 128, K 2048: 419 us against 433, the same build otherwise).
  approx_math: bool = True
  # consumer_registers: each consumer thread's registers after `setmaxnreg` (a multiple of 8, at
  # most 240); the producer gets what is left of the launch's 504 per thread slot. ptxas
  # spilled 340 bytes per thread at 224 / 56 (2026-12-03); where is unknown.
  consumer_registers: int = 224
  # A diagnostic of the staged design: with both set, every warpgroup records its named regions
  # (the scopes in the kernel: waits, dequantize, qk, softmax, pv, issue) for up to
  # profile_steps steps of 64 entries into a Mosaic GPU profiler trace, written to profile_dir
  # as JSON (benchmarks/mosaic_profile.py summarizes it). The records are staged in shared memory,
  # 16 bytes per region per warpgroup, which bounds profile_steps to about 40.
  profile_dir: str = ""
  profile_steps: int = 0


def _plgpu():
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  return plgpu


def _kernel(indptr_ref, idx_ref, q_ref, kv_ref, rope_ref, sink_ref, out_ref, lse_ref,
            q_smem, k_smem, raw_smem, rope_smem, s_smem,
            q_bar, full_bars, free_bars, k_ready_bar, k_free_bar, s_ready_bar,
            *, num_splits, num_stages, dequant_layout, split_qk, producer_warps,
            consumer_registers):
  plgpu = _plgpu()
  seq = lax.axis_index("seq")
  row_block = lax.axis_index("rows")
  split = lax.axis_index("split")
  wg = lax.axis_index("wg")
  row0 = row_block * BLOCK_ROWS

  start = indptr_ref[seq]
  length, chunk_lo, chunk_hi = split_chunks(start, indptr_ref[seq + 1], split, num_splits,
                                            BLOCK_KV)
  steps = chunk_hi - chunk_lo

  def fill_blocks(first_entry, num_entries, profile):
    """Stage entries first_entry .. + num_entries - 1 of every block of this split (the whole
    block for the producer warpgroup, a quarter for one of its warps)."""
    scope = jax.named_scope if profile else lambda _: contextlib.nullcontext()

    @pl.loop(0, steps)
    def _fill(step):
      slot = lax.rem(step, num_stages)

      @pl.when(step >= num_stages)
      def _wait_free():
        with scope("free_wait"):
          plgpu.barrier_wait(free_bars.at[slot])

      base = start + (chunk_lo + step) * BLOCK_KV + first_entry
      copy = functools.partial(plgpu.copy_gmem_to_smem, barrier=full_bars.at[slot],
                               oob_mode=plgpu.OOBFillMode.PROMISE_IN_BOUNDS)
      with scope("issue"):
        # The indices are read INDEX_GROUP at a time before their copies are issued, so the
        # index loads overlap instead of each waiting behind the previous copies. (Reading the
        # next group before issuing this one's copies measured slower on the H200.)
        for g in range(0, num_entries, INDEX_GROUP):
          entries = range(g, min(g + INDEX_GROUP, num_entries))
          rows = [idx_ref[base + j] for j in entries]
          for j, row in zip(entries, rows):
            entry = pl.ds(first_entry + j, 1)
            copy(kv_ref.at[pl.ds(row, 1)], raw_smem.at[slot, entry])
            copy(rope_ref.at[pl.ds(row, 1)], rope_smem.at[slot, entry])

  @pl.when(wg == 2)
  def _producer():
    plgpu.set_max_registers(_producer_registers(consumer_registers), action="decrease")
    if producer_warps:
      # Each of the four warps issues a quarter of every block's copies: Mosaic issues a copy
      # from one elected thread, so one warpgroup issues them one after another.
      @pl.core_map(plgpu.WarpMesh(axis_name="warp"))
      def _per_warp():
        quarter = BLOCK_KV // 4
        fill_blocks(lax.axis_index("warp") * quarter, quarter, profile=False)
    else:
      fill_blocks(0, BLOCK_KV, profile=True)

  @pl.when(wg < 2)
  def _consumer():
    plgpu.set_max_registers(consumer_registers, action="increase")
    # Each consumer copies one half (a TMA box is at most 256 elements along each dimension).
    plgpu.copy_gmem_to_smem(q_ref.at[seq, pl.ds(row0, BLOCK_ROWS), pl.ds(wg * HALF, HALF)],
                            q_smem.at[wg], q_bar)
    plgpu.barrier_wait(q_bar)
    wgmma_layout = plgpu.Layout.WGMMA
    row_layout = wgmma_layout.reduce(1)
    # The dequantization's register layout (MosaicConfig.dequant_layout); its rows are those of
    # the WGMMA layout, so row vectors broadcast into it.
    tile_layout = getattr(plgpu.Layout, DEQUANT_LAYOUTS[dequant_layout])

    def body(step, carry):
      acc, m_i, l_i = carry
      slot = lax.rem(step, num_stages)
      with jax.named_scope("rows_wait"):
        plgpu.barrier_wait(full_bars.at[slot])
      base_entry = (chunk_lo + step) * BLOCK_KV

      def row_bcast(v):
        """A [64] row vector -> [64, 64] in the dequantization layout."""
        return plgpu.layout_cast(lax.broadcast_in_dim(v, (BLOCK_KV, TILE), [0]), tile_layout)

      def tile_scales(tiles):
        """{t: f32 [64] row vector} for the given tiles of this block's rows.

        The scales (bytes 448..461, each stored twice) are staged with the rows: tile t's is
        byte 448 + 2t. The padding bytes among the 16 loaded are never used. (Reading each
        tile's scales as one strided [64] column instead, MosaicConfig.column_scales until
        2026-12-03, gave wrong results on the H200 at its first run, and was removed.)"""
        ref = raw_smem.at[slot, :, pl.ds(layout.SCALE_OFFSET, 16)]
        low = plgpu.load(ref, (), layout=wgmma_layout, optimized=False).astype(jnp.int32)
        col = plgpu.broadcasted_iota(jnp.int32, (BLOCK_KV, 16), 1, layout=wgmma_layout)
        return {t: e8m0_to_f32(jnp.where(col == 2 * t, low, 0).sum(axis=1)) for t in tiles}

      # Entries past the split's end (the block's tail) are staged from real rows, which may
      # hold anything: their K rows are set to 0 (S is masked to -inf below).
      entry = plgpu.broadcasted_iota(jnp.int32, (BLOCK_KV,), 0, layout=row_layout)
      valid = row_bcast(jnp.where(entry + base_entry < length, 1.0, 0.0)) != 0.0

      def dequantize_tile(t, scale, half):
        """Latent tile t of the block's rows -> k_smem[half] (scaled bf16, invalid rows 0)."""
        raw = plgpu.load(raw_smem.at[slot, :, pl.ds(TILE * t, TILE)], (), layout=tile_layout,
                         optimized=False)
        vals = lax.bitcast_convert_type(raw, jnp.float8_e4m3fn).astype(jnp.float32)
        vals = jnp.where(valid, vals * row_bcast(scale), 0.0)
        k_smem[half, :, pl.ds(TILE * t - HALF * half, TILE)] = vals.astype(jnp.bfloat16)

      def copy_rope():
        """The block's RoPE -> the last 64 columns of k_smem[1] (invalid rows 0)."""
        rope = plgpu.load(rope_smem.at[slot], (), layout=tile_layout, optimized=False)
        k_smem[1, :, pl.ds(HALF - layout.ROPE_DIM, layout.ROPE_DIM)] = jnp.where(
            valid, rope, jnp.zeros_like(rope))

      # Before a consumer overwrites its half of the K tile, the other must be done reading it
      # (its QK) and so must it (its QK and PV: waited in order). With split_qk the S exchange
      # already follows the other's QK, so only the duplicated QK needs this barrier. (Keeping
      # it with split_qk measured 3-5% slower on the H200, 2026-12-02.)
      k_free_sync = not split_qk

      if k_free_sync:
        @pl.when(step > 0)
        def _wait_k_free():
          with jax.named_scope("k_free_wait"):
            plgpu.barrier_wait(k_free_bar)

      @pl.when(wg == 0)
      @jax.named_scope("dequantize")
      def _dequantize_first_half():  # latent columns 0..255: tiles 0..3
        scale = tile_scales(range(4))
        for t in range(4):
          dequantize_tile(t, scale[t], 0)

      @pl.when(wg == 1)
      @jax.named_scope("dequantize")
      def _dequantize_second_half():  # tiles 4..6 and the RoPE
        scale = tile_scales(range(4, layout.NUM_TILES))
        for t in range(4, layout.NUM_TILES):
          dequantize_tile(t, scale[t], 1)
        copy_rope()

      plgpu.barrier_arrive(free_bars.at[slot])  # the raw slot may be refilled
      plgpu.commit_smem()  # the generic-proxy stores, before wgmma reads them
      plgpu.barrier_arrive(k_ready_bar)
      with jax.named_scope("k_ready_wait"):
        plgpu.barrier_wait(k_ready_bar)

      def qk(acc_ref, entries=None):
        """S (or, with split_qk, its columns `entries`) over all 512 dims. (Splitting the dims
        over 2 or 4 independent accumulators measured 3-12% slower on the H200.)"""
        for h in range(2):
          k = k_smem.at[h] if entries is None else k_smem.at[h, entries]
          plgpu.wgmma(acc_ref, q_smem.at[h], k.T)
        return acc_ref[...]

      if split_qk:
        half_kv = BLOCK_KV // 2
        mine = pl.ds(wg * half_kv, half_kv)
        with jax.named_scope("qk"):
          s_mine = pl.run_scoped(functools.partial(qk, entries=mine),
                                 plgpu.ACC((BLOCK_ROWS, half_kv), jnp.float32))
        with jax.named_scope("s_exchange"):
          # s_smem is free: the other consumer read it before its arrival on k_ready.
          s_smem[:, mine] = s_mine
          plgpu.barrier_arrive(s_ready_bar)
          plgpu.barrier_wait(s_ready_bar)
          s = plgpu.load(s_smem, (), layout=wgmma_layout, optimized=False)
      else:
        with jax.named_scope("qk"):
          s = pl.run_scoped(qk, plgpu.ACC((BLOCK_ROWS, BLOCK_KV), jnp.float32))
      with jax.named_scope("softmax"):
        p, acc, m_new, l_i = mosaic_consumer.softmax_step(s, base_entry, length, acc, m_i, l_i)

      def pv(acc_ref):
        plgpu.wgmma(acc_ref, p.astype(jnp.bfloat16), k_smem.at[wg])

      with jax.named_scope("pv"):
        acc = pl.run_state(pv)(plgpu.ACC.init(acc))
      if k_free_sync:
        plgpu.barrier_arrive(k_free_bar)
      return acc, m_new, l_i

    acc, m_i, l_i = lax.fori_loop(0, steps, body, mosaic_consumer.initial_state())

    mosaic_consumer.write_results(acc, m_i, l_i, half=wg, seq=seq, row0=row0, split=split,
                                  num_splits=num_splits, sink_ref=sink_ref, out_ref=out_ref,
                                  lse_ref=lse_ref)


# Named regions a warpgroup enters per step: the consumers' seven (rows_wait, dequantize,
# k_ready_wait, qk, softmax, pv, and s_exchange with split_qk or k_free_wait without).
_REGIONS_PER_STEP = 7


def _producer_registers(consumer_registers):
  """The producer's registers: what two consumers leave of the launch's 3 x 168 per thread slot
  (an increase draws only on registers the CTA's other warps released), at most 56, at least
  the hardware's 24."""
  return max(24, min(56, (LAUNCH_REGISTERS - 2 * consumer_registers) // 8 * 8))


def _compiler_params(config):
  """Mosaic GPU compiler parameters: approximate math, and room for the profiler's records
  when profiling is on."""
  if bool(config.profile_dir) != bool(config.profile_steps):
    raise ValueError("MosaicConfig.profile_dir and profile_steps are set together or not at all")
  if config.profile_dir and config.design != "staged":
    raise ValueError("MosaicConfig.profile_dir: only the staged design has profiled regions")
  profile = {}
  if config.profile_dir:
    # profile_space counts regions per warpgroup; a few more for the regions outside the loop.
    # No reduction here crosses warps (every reduced array's rows are split across warps), so
    # Mosaic's reduction scratch (2 KB by default; the lowering raises if one ever needs it) is
    # given to the profiler's records, which then fit beside the default kernel up to K 512.
    profile = dict(profile_space=_REGIONS_PER_STEP * config.profile_steps + 4,
                   profile_dir=config.profile_dir, reduction_scratch_bytes=0)
  return _plgpu().CompilerParams(approx_math=config.approx_math, **profile)


def _staged_kernel(config, splits):
  """This module's kernel and its shared-memory scratch."""
  plgpu = _plgpu()
  # 64-byte swizzle (tiles of 8 x 32 bf16). 128 measured 7% slower on the H200 (2026-12-03).
  swizzled = mosaic_gather.k_tile_transforms()
  stages = config.num_stages
  scratch = dict(
      # Column halves [2, rows, 256]: each is one TMA box, one consumer's PV operand.
      q_smem=plgpu.SMEM((2, BLOCK_ROWS, HALF), jnp.bfloat16, transforms=swizzled),
      k_smem=plgpu.SMEM((2, BLOCK_KV, HALF), jnp.bfloat16, transforms=swizzled),
      raw_smem=plgpu.SMEM((stages, BLOCK_KV, layout.ROW_BYTES), jnp.uint8),
      rope_smem=plgpu.SMEM((stages, BLOCK_KV, layout.ROPE_DIM), jnp.bfloat16),
      q_bar=plgpu.Barrier(num_arrivals=2),
      # One arrival per copy: the row's and the RoPE's, per entry.
      full_bars=plgpu.Barrier(num_arrivals=2 * BLOCK_KV, num_barriers=stages),
      free_bars=plgpu.Barrier(num_arrivals=2, num_barriers=stages),
      k_ready_bar=plgpu.Barrier(num_arrivals=2),
      k_free_bar=plgpu.Barrier(num_arrivals=2),
      # split_qk: S [64, 64], each consumer's 32 columns, and their exchange.
      s_smem=plgpu.SMEM((BLOCK_ROWS, BLOCK_KV) if config.split_qk else (8, 8), jnp.float32),
      s_ready_bar=plgpu.Barrier(num_arrivals=2),
  )
  kernel = functools.partial(_kernel, num_splits=splits, num_stages=stages,
                             dequant_layout=config.dequant_layout,
                             split_qk=config.split_qk, producer_warps=config.producer_warps,
                             consumer_registers=config.consumer_registers)
  return scratch, kernel


def mosaic_decode(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, *, tokens_per_seq: int,
                  num_kv_splits_: int | None = None, return_lse: bool = True,
                  config: MosaicConfig | None = None):
  """Decode with the Mosaic GPU kernel; arguments as `pallas_decode.pallas_decode`."""
  plgpu = _plgpu()
  config = config or MosaicConfig()
  if config.split_rule not in pallas_plan.SPLIT_RULES:
    raise ValueError(f"MosaicConfig.split_rule must be one of {pallas_plan.SPLIT_RULES}, "
                     f"got {config.split_rule!r}")
  if config.design not in DESIGNS:
    raise ValueError(f"MosaicConfig.design must be one of {DESIGNS}, got {config.design!r}")
  direct = config.design == "direct"
  if not direct and (config.consumers is not None or config.inputs_in_kernel is not None
                     or config.pair_row_blocks is not None
                     or config.direct_registers is not None or config.stage_output is not None
                     or config.stage_partials):
    raise ValueError("MosaicConfig.consumers, inputs_in_kernel, pair_row_blocks, "
                     "direct_registers, stage_output and stage_partials belong to the direct "
                     "design")
  consumers = config.consumers or "p_exchange"
  if consumers not in mosaic_direct.CONSUMERS:
    raise ValueError(f"MosaicConfig.consumers must be one of {mosaic_direct.CONSUMERS}, "
                     f"got {config.consumers!r}")
  if consumers == "seesaw" and config.inputs_in_kernel:
    raise ValueError("MosaicConfig.inputs_in_kernel does not combine with the \"seesaw\" "
                     "consumers")
  for field in ("stage_output", "stage_partials"):
    if getattr(config, field) and not consumers.startswith("p_exchange"):
      raise ValueError(f"MosaicConfig.{field} needs the \"p_exchange\" consumers "
                       f"(or \"p_exchange_qk_ahead\"), got {consumers!r}")
  if config.direct_registers is not None and (
      len(config.direct_registers) != 3 or sum(config.direct_registers) > LAUNCH_REGISTERS
      or any(r % 8 or not 24 <= r <= 256 for r in config.direct_registers)):
    raise ValueError("MosaicConfig.direct_registers must be three multiples of 8 in 24..256 "
                     f"summing to at most {LAUNCH_REGISTERS}, got {config.direct_registers!r}")
  if not 0 <= config.s_padding <= 32:
    raise ValueError(f"MosaicConfig.s_padding must be in 0..32, got {config.s_padding}")
  if config.consumer_registers % 8 or not 224 <= config.consumer_registers <= 240:
    raise ValueError("MosaicConfig.consumer_registers must be a multiple of 8 in 224..240, "
                     f"got {config.consumer_registers!r}")
  if config.dequant_layout not in DEQUANT_LAYOUTS:
    raise ValueError("MosaicConfig.dequant_layout must be "
                     f"{' or '.join(map(repr, DEQUANT_LAYOUTS))}, "
                     f"got {config.dequant_layout!r}")
  compiler_params = _compiler_params(config)
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
  in_kernel = direct and (config.inputs_in_kernel if config.inputs_in_kernel is not None
                          else consumers != "seesaw")
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

  pair = direct and config.pair_row_blocks is not False and row_blocks % 2 == 0
  grid = dict(grid=(num_seqs, row_blocks, splits), grid_names=("seq", "rows", "split"))
  if pair:  # "rows" counts pairs of row blocks; "pair" (the cluster) one of the two
    grid.update(grid=(num_seqs, row_blocks // 2, splits), cluster=(2,), cluster_names=("pair",))
  if direct:
    scratch = mosaic_direct.scratch_types(consumers, config.s_padding, pair=pair,
                                          stage_partials=config.stage_partials)
    kernel = functools.partial(mosaic_direct.kernel, num_splits=splits, rows=rows,
                               consumers=consumers, inputs_in_kernel=in_kernel, pair=pair,
                               registers=config.direct_registers,
                               stage_output=config.stage_output is not False
                               and consumers.startswith("p_exchange"),
                               stage_partials=config.stage_partials)
  else:
    scratch, kernel = _staged_kernel(config, splits)
  results = plgpu.kernel(
      kernel, out_type=pallas_plan.result_types(num_seqs, splits, padded_rows),
      scratch_types=scratch,
      compiler_params=compiler_params,
      num_threads=3, thread_name="wg", **grid,
  )(kv_indptr.astype(jnp.int32), indices, *q_inputs, kv, kv_rope, sink_rows)
  out, lse = pallas_merge.finish(results, splits, sink_rows, rows=rows, num_tokens=num_tokens,
                                 num_heads=num_heads)
  return out, (lse if return_lse else None)
