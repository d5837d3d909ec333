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


MAPPINGS = ("lines", "rows")
MATHS = ("f32", "bf16", "none")


def gather_dequantize(kv_ref, rope_ref, idx_ref, num_valid, k_smem, *, mapping="lines",
                      math="f32"):
  """Fills k_smem [2, 64, 256] bf16 (k_tile_transforms()) with rows idx_ref[0 .. 63] of the
  packed pool: kv_ref [N, 512] uint8, rope_ref [N, 64] bf16, idx_ref [64] int32 (all in global
  memory), num_valid an int32 scalar. Called by one whole warpgroup; the caller fences
  (`plgpu.commit_smem`) and synchronizes before the tile is read.

  mapping: which thread moves which bytes (the tile is the same). "lines": each load
  instruction of a warp reads four rows' 128-byte lines whole, and each quarter-warp stores
  into eight distinct bank groups. "rows": one row per thread, so each load instruction
  touches 32 lines and relies on L1 to keep them between a thread's successive loads.
  math: "f32" the dequantization in f32 (fp8 -> f16 -> f32, times the scale, -> bf16);
  "bf16" the same values from bit shifts and bf16x2 multiplies (fewer conversions); "none"
  stores the fp8 words unconverted (wrong values: for measuring what the conversion costs,
  benchmarks/mosaic_stage_rates.py)."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  if mapping not in MAPPINGS:
    raise ValueError(f"mapping must be one of {MAPPINGS}, got {mapping!r}")
  if math not in MATHS:
    raise ValueError(f"math must be one of {MATHS}, got {math!r}")

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.RefType(), plgpu.RefType(),
                                plgpu.Layout.WG_SPLAT(shape=()),
                                plgpu.RefType(k_tile_transforms())))
  def fill(ctx, kv, rope, idx, valid_count, k):
    del ctx
    _emit_fill(kv, rope, idx, valid_count.registers.flat[0], k, mapping, math)

  fill(kv_ref, rope_ref, idx_ref, num_valid, k_smem)


def _emit_fill(kv, rope, idx, valid_count, k, mapping, math):
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

  def fp8x4_to_bf16_packed(word, scale_pair):
    """The same in bf16x2 math, off the conversion units but for the one fp8 conversion:
    an e4m3 value is a normal f16 (or zero) with 3 mantissa bits, so its f16 bits shifted
    right by 3 (sign kept) are a bf16 of value * 2^-112, exact; two exact-or-once-rounded
    bf16 multiplies by 2^112 and by the scale (a bf16 pair) follow, and NaN halves (e4m3's
    0x7f / 0xff, which the shift makes finite) are set back to NaN."""
    return asm(2, [word, scale_pair], """{
      .reg .b16 lo, hi;
      .reg .b32 a, b, sa, sb, na, nb, up;
      mov.b32 {lo, hi}, $2;
      mov.b32 up, 0x77807780;
      cvt.rn.f16x2.e4m3x2 a, lo;
      cvt.rn.f16x2.e4m3x2 b, hi;
      set.nan.u32.f16x2 na, a, a;
      set.nan.u32.f16x2 nb, b, b;
      and.b32 sa, a, 0x80008000;
      and.b32 sb, b, 0x80008000;
      shr.b32 a, a, 3;
      shr.b32 b, b, 3;
      and.b32 a, a, 0x0FFF0FFF;
      and.b32 b, b, 0x0FFF0FFF;
      or.b32 a, a, sa;
      or.b32 b, b, sb;
      mul.rn.bf16x2 a, a, up;
      mul.rn.bf16x2 b, b, up;
      mul.rn.bf16x2 a, a, $3;
      mul.rn.bf16x2 b, b, $3;
      or.b32 $0, a, na;
      or.b32 $1, b, nb;
    }""", "=r,=r,r,r")

  def e8m0_bits(byte, exponent_shift, subnormal_half, nan):
    """2^(byte - 127) as the bits of a float whose exponent starts at bit exponent_shift, with
    byte 0 the subnormal 2^-127 and 255 NaN (kernel_math's e8m0_to_f32)."""
    bits = arith.shli(byte, c32(exponent_shift))
    bits = arith.select(arith.cmpi(arith.CmpIPredicate.eq, byte, c32(0)), c32(subnormal_half),
                        bits)
    return arith.select(arith.cmpi(arith.CmpIPredicate.eq, byte, c32(255)), c32(nan), bits)

  def e8m0_scale(byte):
    """The scale as the conversion's second operand: an f32, or a pair of bf16."""
    if math == "bf16":
      bits = e8m0_bits(byte, 7, 0x0040, 0x7FC0)
      return arith.ori(bits, arith.shli(bits, c32(16)))
    return arith.bitcast(f32, e8m0_bits(byte, 23, 0x00400000, 0x7FC00000))

  def dequantize16(words, scale, valid):
    """One 16-byte load of fp8 (four words) -> eight words of bf16, zeros for invalid rows."""
    if math == "none":
      out = list(words) * 2
    else:
      convert = fp8x4_to_bf16_packed if math == "bf16" else fp8x4_to_bf16
      out = [o for w in words for o in convert(w, scale)]
    return [arith.select(valid, o, zero) for o in out]

  def tile_scale(scales, tile):
    """The f32 scale of `tile` (a Python or IR int) from the row's 16 scale bytes (four words;
    the bytes are s0 s0 s1 s1 ..., tile t's first copy is byte 2 t)."""
    if isinstance(tile, int):
      word, shift = scales[tile // 2], c32(16 * (tile % 2))
    else:  # tile = 2 * word + (0 or 1), the word a Python int
      word, shift = scales[tile[0]], arith.muli(tile[1], c32(16))
    return e8m0_scale(arith.andi(arith.shrui(word, shift), c32(0xFF)))

  def row_entry(row):
    """(valid, entry as i64) of a tile row. An invalid row's index is not read (it may lie
    past the list): row 0 of the pool is read in its place, its values replaced by zeros."""
    valid = arith.cmpi(arith.CmpIPredicate.slt, row, valid_count)
    entry = memref.load(idx, [arith.index_cast(ir.IndexType.get(),
                                               arith.select(valid, row, c32(0)))])
    return valid, arith.extui(i64, arith.select(valid, entry, c32(0)))

  zero = c32(0)
  kv_base = llvm.ptrtoint(i64, mgpu_utils.memref_ptr(kv))
  rope_base = llvm.ptrtoint(i64, mgpu_utils.memref_ptr(rope))
  k_base = llvm.ptrtoint(i32, mgpu_utils.memref_ptr(k))

  def addresses(entry64):
    return (arith.addi(kv_base, arith.muli(entry64, c64(layout.ROW_BYTES))),
            arith.addi(rope_base, arith.muli(entry64, c64(2 * layout.ROPE_DIM))))

  def k_address(half, row, col):
    offset = k_tile_offset(_Int(half), _Int(row), _Int(col))
    return arith.addi(k_base, offset.value)

  tid = arith.index_cast(i32, gpu.thread_id(gpu.Dimension.x))
  lane_in_group = arith.remui(tid, c32(128))
  warp = arith.divui(lane_in_group, c32(32))
  lane = arith.remui(lane_in_group, c32(32))
  if mapping == "lines":
    _emit_lines(warp, lane, row_entry, addresses, load16, store16, dequantize16, tile_scale,
                k_address)
    return

  # "rows": warps 0, 1 take tiles 0-3 of rows 0-31 and 32-63, warps 2, 3 tiles 4-6 and the RoPE.
  half = arith.divui(warp, c32(2))
  row = arith.addi(arith.muli(arith.remui(warp, c32(2)), c32(32)), lane)
  valid, entry64 = row_entry(row)
  row_address, rope_address = addresses(entry64)

  def emit_half(first_tile, num_tiles, with_rope):
    scales = load16(arith.addi(row_address, c64(layout.SCALE_OFFSET)))
    words = []  # every load first, so their latencies overlap
    for j in range(num_tiles * layout.TILE // CHUNK):
      offset = first_tile * layout.TILE + j * CHUNK
      words.append(load16(arith.addi(row_address, c64(offset))))
    rope_words = [load16(arith.addi(rope_address, c64(j * CHUNK)))
                  for j in range(2 * layout.ROPE_DIM // CHUNK)] if with_rope else []
    for t in range(num_tiles):
      scale = tile_scale(scales, first_tile + t)
      for j in range(layout.TILE // CHUNK):
        out = dequantize16(words[t * layout.TILE // CHUNK + j], scale, valid)
        col = t * layout.TILE + j * CHUNK  # within the half
        store16(k_address(half, row, c32(col)), out[:4])
        store16(k_address(half, row, c32(col + 8)), out[4:])
    for j, w in enumerate(rope_words):
      col = num_tiles * layout.TILE + j * 8
      store16(k_address(half, row, c32(col)), [arith.select(valid, x, zero) for x in w])

  with mgpu_utils.when(arith.cmpi(arith.CmpIPredicate.eq, half, c32(0))):
    emit_half(0, 4, with_rope=False)
  with mgpu_utils.when(arith.cmpi(arith.CmpIPredicate.ne, half, c32(0))):
    emit_half(4, layout.NUM_TILES - 4, with_rope=True)


LINE = 128  # bytes of a row read by one warp-wide load (eight lanes x 16 bytes)
ROWS_PER_LOAD = 4  # rows per warp-wide load: 32 lanes x 16 bytes / LINE
GROUPS_IN_FLIGHT = 2  # row groups whose loads are issued before any is converted
ROPE_FIRST_COL = layout.NOPE_DIM - HALF  # the RoPE's first column in the tile's second half


def lines_lane_work(lane):
  """The "lines" mapping of a lane (0..31; a Python int or an IR value): (its row within each
  group of four, its 16-byte piece of every 128-byte fp8 line, its piece of the RoPE line)."""
  quarter, odd = lane // 8, lane % 2
  return lane % 8 // 2, quarter * 2 + odd, quarter // 2 * 4 + quarter % 2 + odd * 2


def lines_store_columns(piece, line):
  """(half, first column) of the two 8-column stores of a piece of fp8 line `line`."""
  half, first_col = divmod(line * LINE, HALF)  # a byte of fp8 is a column
  return half, piece * 16 + first_col


def _emit_lines(warp, lane, row_entry, addresses, load16, store16, dequantize16, tile_scale,
                k_address):
  """The "lines" mapping. Warp w fills rows 16 w .. 16 w + 15 in four groups of four rows.
  Lane l works on row 4 g + (l % 8) // 2 of group g and, in each 128-byte line of it, on the
  16-byte piece 2 (l // 8) + l % 2: a load instruction reads four whole lines, and the eight
  lanes of a quarter-warp (one shared-memory wavefront of 16-byte stores) hold four
  consecutive rows (four distinct lines of the 64-byte swizzle) times two chunk columns, which
  the swizzle puts in eight distinct bank groups. The RoPE line (64 bf16, no conversion) uses
  pieces 4 (q // 2) + q % 2 + 2 (l % 2) for quarter q, for the same reason."""
  # pylint: disable=import-outside-toplevel
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import arith

  i32 = ir.IntegerType.get_signless(32)
  i64 = ir.IntegerType.get_signless(64)
  c32 = lambda v: mgpu_utils.c(v, i32)
  row_in_group, piece, rope_piece = (x.value for x in lines_lane_work(_Int(lane)))
  piece_bytes = arith.extui(i64, arith.muli(piece, c32(16)))
  rope_bytes = arith.extui(i64, arith.muli(rope_piece, c32(16)))
  second_tile = arith.divui(piece, c32(4))  # which of its line's two tiles the piece is in
  lines = layout.NOPE_DIM // LINE + 1  # 3.5 lines of fp8: the last one half used
  in_last_line = arith.cmpi(arith.CmpIPredicate.ult, piece, c32((layout.NOPE_DIM % LINE) // 16))

  def add(a, b):
    return arith.addi(a, mgpu_utils.c(b, a.type) if isinstance(b, int) else b)

  groups = BLOCK_ROWS // 4 // ROWS_PER_LOAD  # per warp
  for first in range(0, groups, GROUPS_IN_FLIGHT):
    loaded = []
    for g in range(first, first + GROUPS_IN_FLIGHT):  # every load of these groups first
      row = add(add(arith.muli(warp, c32(BLOCK_ROWS // 4)), g * ROWS_PER_LOAD), row_in_group)
      valid, entry64 = row_entry(row)
      row_address, rope_address = addresses(entry64)
      scales = load16(add(row_address, layout.SCALE_OFFSET))
      data = [load16(add(add(row_address, j * LINE), piece_bytes)) for j in range(lines)]
      rope_words = load16(add(rope_address, rope_bytes))
      loaded.append((row, valid, scales, data, rope_words))
    for row, valid, scales, data, rope_words in loaded:
      for j, words in enumerate(data):
        # Line j holds tiles 2 j and 2 j + 1; this piece's dims start at j * LINE + 16 piece.
        out = dequantize16(words, tile_scale(scales, (j, second_tile)), valid)
        half, col = lines_store_columns(_Int(piece), j)
        col = col.value

        def store(out=out, half=half, col=col):
          store16(k_address(c32(half), row, col), out[:4])
          store16(k_address(c32(half), row, add(col, 8)), out[4:])
        if j == lines - 1:
          with mgpu_utils.when(in_last_line):
            store()
        else:
          store()
      col = add(arith.muli(rope_piece, c32(8)), ROPE_FIRST_COL)
      store16(k_address(c32(1), row, col), [arith.select(valid, x, c32(0)) for x in rope_words])


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
