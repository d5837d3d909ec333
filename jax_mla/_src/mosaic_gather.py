"""Gathering a block of packed KV rows from global memory straight into the Mosaic kernel's
swizzled bf16 K tile: every thread loads, dequantizes and stores its own row's bytes.

EXPERIMENTAL: the producer of MosaicConfig(design="direct") (mosaic_direct). Pallas's loads
read global memory only as slices shared by a whole warpgroup, so the staged kernel copies each
gathered row into shared memory with a bulk copy first (40 KB per block), and that staging is
what leaves no room for a second K tile (benchmarks/NOTES-pallas.md). This does the gather the
way FlashMLA's sm90 kernel does, with per-thread 16-byte loads, written in Mosaic GPU's
lower-level IR through `plgpu.inline_mgpu` (inline PTX for the loads, the fp8 conversions and
the shared-memory stores). On the H200 (2026-12-03) the tile matched numpy bit for bit, at
2.34 us per block of 64 rows per warpgroup with 132 CTAs gathering at once.

Work split of one warpgroup over a block of 64 rows: warps 0 and 1 take the first half of the
latent dims (tiles 0-3) of rows 0-31 and 32-63, warps 2 and 3 the second half (tiles 4-6 and
the RoPE), one row per thread, so no warp diverges. The K tile is [2 halves, 64 rows, 256] bf16
with tiles of 8 x 32 and the 64-byte swizzle (k_tile_transforms(), the kernels'); rows at or past
`num_valid` are written as zeros and their index is not read.
"""

from __future__ import annotations

from jax_mla._src import layout

BLOCK_ROWS = 64
HALF = layout.HEAD_DIM // 2  # 256 dims per half of the K tile
SWIZZLE_BYTES = 64
TILE_COLS = SWIZZLE_BYTES // 2  # bf16 columns per 8-row swizzle tile
CHUNK = 16  # bytes per load and per store


def k_tile_transforms():
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  return (plgpu.TilingTransform((8, TILE_COLS)), plgpu.SwizzleTransform(SWIZZLE_BYTES))


def k_tile_offset(half, row, col):
  """Byte offset of K[half, row, col .. col + 7] in the tiled, swizzled tile (the hardware's
  64-byte swizzle: the 16-byte chunk index within a 64-byte line XORs bits 7-8 of the
  address). Works on Python ints (tests) and on the IR builders' values alike."""
  tile = (half * (BLOCK_ROWS // 8) + row // 8) * (HALF // TILE_COLS) + col // TILE_COLS
  line = row % 8
  chunk = (col % TILE_COLS) // 8
  return tile * 8 * SWIZZLE_BYTES + line * SWIZZLE_BYTES + (chunk ^ (line // 2 % 4)) * CHUNK


def gather_dequantize(kv_ref, rope_ref, idx_ref, num_valid, k_smem):
  """Fills k_smem [2, 64, 256] bf16 (k_tile_transforms()) with rows idx_ref[0 .. 63] of the
  packed pool: kv_ref [N, 512] uint8, rope_ref [N, 64] bf16, idx_ref [64] int32 (all in global
  memory), num_valid an int32 scalar. Called by one whole warpgroup; the caller fences
  (`plgpu.commit_smem`) and synchronizes before the tile is read."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.RefType(), plgpu.RefType(),
                                plgpu.Layout.WG_SPLAT(shape=()),
                                plgpu.RefType(k_tile_transforms())))
  def fill(ctx, kv, rope, idx, valid_count, k):
    del ctx
    _emit_fill(kv, rope, idx, valid_count.registers.flat[0], k)

  fill(kv_ref, rope_ref, idx_ref, num_valid, k_smem)


def _emit_fill(kv, rope, idx, valid_count, k):
  # pylint: disable=import-outside-toplevel
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import arith, gpu, llvm, memref

  i32 = ir.IntegerType.get_signless(32)
  i64 = ir.IntegerType.get_signless(64)
  f32 = ir.F32Type.get()
  c32 = lambda v: mgpu_utils.c(v, i32)
  c64 = lambda v: mgpu_utils.c(v, i64)

  def asm(results, operands, text, constraints):
    ty = i32 if results == 1 else llvm.StructType.get_literal([i32] * results)
    out = llvm.inline_asm(ty, operands, text, constraints, has_side_effects=False)
    return [out] if results == 1 else [llvm.extractvalue(i32, out, [i]) for i in range(results)]

  def load16(address):
    """Four words from global memory (non-coherent cache path: the pool is read-only here)."""
    return asm(4, [address], "ld.global.nc.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l")

  def store16(address, words):
    llvm.inline_asm(ir.Type.parse("!llvm.void"), [address, *words],
                    "st.shared.v4.b32 [$0], {$1, $2, $3, $4};", "r,r,r,r,r",
                    has_side_effects=True)

  def fp8x4_to_bf16(word, scale):
    """Four e4m3 bytes -> two words of bf16 pairs, each value times scale (f32 math)."""
    return asm(2, [word, scale], """{
      .reg .b16 lo, hi;
      .reg .b32 a, b;
      .reg .b16 a0, a1, b0, b1;
      .reg .f32 f0, f1, f2, f3;
      mov.b32 {lo, hi}, $2;
      cvt.rn.f16x2.e4m3x2 a, lo;
      cvt.rn.f16x2.e4m3x2 b, hi;
      mov.b32 {a0, a1}, a;
      mov.b32 {b0, b1}, b;
      cvt.f32.f16 f0, a0;
      cvt.f32.f16 f1, a1;
      cvt.f32.f16 f2, b0;
      cvt.f32.f16 f3, b1;
      mul.rn.f32 f0, f0, $3;
      mul.rn.f32 f1, f1, $3;
      mul.rn.f32 f2, f2, $3;
      mul.rn.f32 f3, f3, $3;
      cvt.rn.bf16x2.f32 $0, f1, f0;
      cvt.rn.bf16x2.f32 $1, f3, f2;
    }""", "=r,=r,r,f")

  def e8m0_scale(byte):
    """2^(byte - 127) as f32, with byte 0 the subnormal 2^-127 and 255 NaN (kernel_math's
    e8m0_to_f32)."""
    bits = arith.shli(byte, c32(23))
    bits = arith.select(arith.cmpi(arith.CmpIPredicate.eq, byte, c32(0)), c32(0x00400000), bits)
    bits = arith.select(arith.cmpi(arith.CmpIPredicate.eq, byte, c32(255)), c32(0x7FC00000),
                        bits)
    return arith.bitcast(f32, bits)

  tid = arith.index_cast(i32, gpu.thread_id(gpu.Dimension.x))
  lane_in_group = arith.remui(tid, c32(128))
  warp = arith.divui(lane_in_group, c32(32))
  half = arith.divui(warp, c32(2))  # warps 0, 1: tiles 0-3; warps 2, 3: tiles 4-6 and RoPE
  row = arith.addi(arith.muli(arith.remui(warp, c32(2)), c32(32)),
                   arith.remui(lane_in_group, c32(32)))
  valid = arith.cmpi(arith.CmpIPredicate.slt, row, valid_count)
  # An invalid row's index is not read (it may lie past the list); row 0 of the pool is read
  # in its place and its values are replaced by zeros below.
  safe_row = arith.select(valid, row, c32(0))
  entry = memref.load(idx, [arith.index_cast(ir.IndexType.get(), safe_row)])
  entry = arith.select(valid, entry, c32(0))
  entry64 = arith.extui(i64, entry)

  kv_base = llvm.ptrtoint(i64, mgpu_utils.memref_ptr(kv))
  rope_base = llvm.ptrtoint(i64, mgpu_utils.memref_ptr(rope))
  k_base = llvm.ptrtoint(i32, mgpu_utils.memref_ptr(k))
  row_address = arith.addi(kv_base, arith.muli(entry64, c64(layout.ROW_BYTES)))
  rope_address = arith.addi(rope_base, arith.muli(entry64, c64(2 * layout.ROPE_DIM)))
  zero = c32(0)

  def k_address(col):
    offset = k_tile_offset(_Int(half), _Int(row), _Int(c32(col)))
    return arith.addi(k_base, offset.value)

  def emit_half(first_tile, num_tiles, with_rope):
    scales = load16(arith.addi(row_address, c64(layout.SCALE_OFFSET)))
    words = []  # every load first, so their latencies overlap
    for j in range(num_tiles * layout.TILE // CHUNK):
      offset = first_tile * layout.TILE + j * CHUNK
      words.append(load16(arith.addi(row_address, c64(offset))))
    rope_words = [load16(arith.addi(rope_address, c64(j * CHUNK)))
                  for j in range(2 * layout.ROPE_DIM // CHUNK)] if with_rope else []
    for t in range(num_tiles):
      tile = first_tile + t
      # Scale bytes: s0 s0 s1 s1 ...; tile's first copy is byte 2 * tile.
      byte = arith.andi(arith.shrui(scales[tile // 2], c32(16 * (tile % 2))), c32(0xFF))
      scale = e8m0_scale(byte)
      for j in range(layout.TILE // CHUNK):
        chunk_words = words[t * layout.TILE // CHUNK + j]
        out = []
        for w in chunk_words:
          out.extend(fp8x4_to_bf16(w, scale))
        out = [arith.select(valid, o, zero) for o in out]
        col = t * layout.TILE + j * CHUNK  # within the half
        store16(k_address(col), out[:4])
        store16(k_address(col + 8), out[4:])
    for j, w in enumerate(rope_words):
      col = num_tiles * layout.TILE + j * 8
      store16(k_address(col), [arith.select(valid, x, zero) for x in w])

  with mgpu_utils.when(arith.cmpi(arith.CmpIPredicate.eq, half, c32(0))):
    emit_half(0, 4, with_rope=False)
  with mgpu_utils.when(arith.cmpi(arith.CmpIPredicate.ne, half, c32(0))):
    emit_half(4, layout.NUM_TILES - 4, with_rope=True)


class _Int:
  """An i32 IR value with the integer operators k_tile_offset uses (a constant right operand
  may be a Python int)."""

  def __init__(self, value):
    self.value = value

  def _op(self, other, fn):
    # pylint: disable=import-outside-toplevel
    from jax.experimental.mosaic.gpu import utils as mgpu_utils
    from jaxlib.mlir import ir
    if isinstance(other, _Int):
      other = other.value
    elif isinstance(other, int):
      other = mgpu_utils.c(other, ir.IntegerType.get_signless(32))
    return _Int(fn(self.value, other))

  def __add__(self, other):
    from jaxlib.mlir.dialects import arith  # pylint: disable=import-outside-toplevel
    return self._op(other, arith.addi)

  __radd__ = __add__

  def __mul__(self, other):
    from jaxlib.mlir.dialects import arith  # pylint: disable=import-outside-toplevel
    return self._op(other, arith.muli)

  __rmul__ = __mul__

  def __floordiv__(self, other):
    from jaxlib.mlir.dialects import arith  # pylint: disable=import-outside-toplevel
    return self._op(other, arith.divui)

  def __mod__(self, other):
    from jaxlib.mlir.dialects import arith  # pylint: disable=import-outside-toplevel
    return self._op(other, arith.remui)

  def __xor__(self, other):
    from jaxlib.mlir.dialects import arith  # pylint: disable=import-outside-toplevel
    return self._op(other, arith.xori)
