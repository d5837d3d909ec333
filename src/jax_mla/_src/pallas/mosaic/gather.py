"""Gathering a block of packed KV rows from global memory straight into the Mosaic kernel's
swizzled bf16 K tile: every thread loads, dequantizes and stores its share of the rows' bytes.

The producer of the Mosaic kernel (mosaic.kernel). Pallas's loads read global memory only as slices
shared by a whole warpgroup, so the first ("staged") design, removed on 2026-12-03, copied each
gathered row into shared memory with a bulk copy first (40 KB per block), and that staging left
no room for a second K tile (benchmarks/README.md). This does the gather the
way FlashMLA's sm90 kernel does, with per-thread 16-byte loads, written in Mosaic GPU's
lower-level IR through `plgpu.inline_mgpu` (inline PTX for the loads, the fp8 conversions and
the shared-memory stores). On the H200 (2026-12-03) the tile matched numpy bit for bit, at
1.62 us per block of 64 rows per warpgroup with 132 CTAs gathering at once.

Work split of one warpgroup over a block of 64 rows (lane_work): warp w fills rows 16 w ..
16 w + 15 in four groups of four rows. Each load instruction of a warp reads four rows' 128-byte
lines whole (eight lanes per line), and the eight lanes of each quarter-warp, one shared-memory
wavefront of 16-byte stores, write four consecutive rows times two chunk columns, which the
64-byte swizzle puts in eight distinct bank groups. (The first version gave each thread a whole
row: 2.81 us per block, every load instruction touching 32 lines.) The K tile is [2 halves,
64 rows, 256] bf16 with tiles of 8 x 32 and the 64-byte swizzle (k_tile_transforms(), the
kernels'); rows at or past `num_valid` are written as zeros and their index is not read.
`copy_consecutive` fills the same tile from float rows (Q as the model holds it, bf16 or f32:
no dequantization, f32 rounded to bf16) with the RoPE line's work split for each 64 values;
`gather_float` does the same by index for a float pool (a bf16 or f32 window cache: the
producer's rows), paired CTAs included. Its loads in flight per thread (64 words: two row
groups of bf16 or one of f32) fit the producer's registers (128 paired, 152 unpaired). On the H200 (2026-12-04) a decode whose window pool was bf16 took 1.006-1.098x the
time of one packed pool holding the same entries (benchmarks/README.md, two sources).

`gather_dequantize` fills a tile in one call (Q's tile, `gather_consecutive`, and the tile
tests). The kernel's producer runs the same per-group loads and conversion (_FillEmitter)
pipelined: `gather_issue` loads a split's first block's first CARRIED_GROUPS row groups, and
each `gather_step` converts a block while issuing every later group's loads one group ahead,
the next block's first groups included, and returns those loaded words for the next step (a
jax array carried through the producer's loop; `step_schedule` is the order). Before, each
block waited for its own loads (H200, 2026-12-04: 198.2 against 202.7 us at 128 heads, B 128,
K 2048).
"""

from __future__ import annotations

import jax.numpy as jnp

from jax_mla._src import layout
from jax_mla._src.jax_compat import read_only_ref_type

BLOCK_ROWS = 64
HALF = layout.HEAD_DIM // 2  # 256 dims per half of the K tile
SWIZZLE_BYTES = 64
TILE_COLS = SWIZZLE_BYTES // 2  # bf16 columns per 8-row swizzle tile
CHUNK = 16  # bytes per load and per store
LINE = 128  # bytes of a row read by one warp-wide load (eight lanes x 16 bytes)
ROWS_PER_LOAD = 4  # rows per warp-wide load: 32 lanes x 16 bytes / LINE
GROUPS_IN_FLIGHT = 2  # row groups whose loads are issued before any is converted
FP8_LINES = -(-layout.NOPE_DIM // LINE)  # 3.5 lines of fp8 per row: the last one half used
# Words a lane loads per row group: its row's 16 scale bytes, its piece of each fp8 line, its
# piece of the RoPE line.
WORDS_PER_GROUP = 4 + 4 * FP8_LINES + 4
# Row groups whose loads the pipelined producer (gather_step) carries from one block to the
# next, paired (two groups per warp and block) and unpaired (four): 24 words per group held
# across the loop, one group more live while a group is converted.
CARRIED_GROUPS = {True: 2, False: 2}
# Whether gather_step issues each group's loads right after converting the group `carried`
# before it rather than before converting it, paired / unpaired. After: the new words may take
# the converted group's registers, so ptxas no longer copies the next block's words into the
# loop's carried registers at the step's end, waiting there for their loads (H100, 2026-12-06,
# paired: 154.1 against 158.5 us at 128 heads, B 128, K 2048). Unpaired (four groups, two
# carried) it leaves a group's loads one conversion to land instead of two: 107.0 against 102.3
# at 64 heads, B 128, K 2048.
ISSUE_AFTER_CONVERT = {True: True, False: False}
# PTX qualifiers of the K gather's global loads (between ld.global.nc and .v4), paired /
# unpaired. No L1 line is allocated for the paired rows (L1 hit rate 6%): 51.7 against 54.9 us
# at 128 heads, B 128, K 512 on an H100 (2026-12-06, bit-identical; 153.2 against 153.9 at
# K 2048). Unpaired it lost (107.6 against 102.3 at 64 heads, B 128, K 2048), and so did Q's
# loads (26.5 against 26.1 at 128 heads, B 64, K 512); neither investigated.
K_LOAD_QUALIFIERS = {True: ".L1::no_allocate", False: ""}
ROPE_FIRST_COL = layout.NOPE_DIM - HALF  # the RoPE's first column in the tile's second half
# "bf16" (gather_dequantize's default, the kernel's): fp8 -> f16 -> f32 -> bf16, then times the
# tile scale in bf16x2: two multiplies per four values. "f32" (Q's, once per CTA): times the
# scale in f32 before rounding to bf16: four. Both give the same bits (the scale is a power of
# two, so each rounds once; the bit-for-bit GPU test holds both). On the H200 (2026-12-04) "bf16"
# took 112.1 against 124.0 us at 64 heads, B 128, K 2048 and 204.2 against 209.1 at 128 heads.
# "none": the fp8 words stored unconverted, wrong values, for measuring what the conversion
# costs. Slower: a bf16x2 form that decoded the fp8 bits with shifts instead of cvt (1.88 us per
# block against 1.62, 2026-12-03).
MATHS = ("f32", "bf16", "none")
# Bytes one CTA of a pair (gather_dequantize's pair) writes into the other's K tile per
# block: half the rows, both halves of the tile, bf16.
PEER_BYTES = BLOCK_ROWS // 2 * 2 * HALF * 2


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


def lane_work(lane):
  """What lane 0..31 of a warp moves (a Python int or an IR value): (its row within each group
  of four, its 16-byte piece of every 128-byte fp8 line, its 16-byte piece of the RoPE line).
  The RoPE pieces (no conversion: one store per piece) are spread over a quarter-warp
  differently from the fp8 ones (two stores per piece) so that both stores are conflict-free."""
  quarter, odd = lane // 8, lane % 2
  return lane % 8 // 2, quarter * 2 + odd, quarter // 2 * 4 + quarter % 2 + odd * 2


def block_row(warp, group, row_in_group, rank=None):
  """The block row (0..63) that a warp's lanes with `row_in_group` (lane_work) fill in its row
  group `group` (0 .. groups_per_warp(paired) - 1). With rank (0 or 1, a pair's CTA), the warps
  share that CTA's half of the block. Python ints (tests) or IR values (_Int) alike."""
  if rank is None:
    return warp * (BLOCK_ROWS // 4) + group * ROWS_PER_LOAD + row_in_group
  return rank * (BLOCK_ROWS // 2) + warp * (BLOCK_ROWS // 8) + group * ROWS_PER_LOAD + row_in_group


def groups_per_warp(paired):
  return BLOCK_ROWS // (8 if paired else 4) // ROWS_PER_LOAD


def fp8_store_columns(piece, line):
  """(half, first column) of the two 8-column stores of a piece of fp8 line `line`."""
  half, first_col = divmod(line * LINE, HALF)  # a byte of fp8 is a column
  return half, piece * 16 + first_col


def gather_dequantize(kv_ref, rope_ref, idx_ref, num_valid, k_smem, *, math="bf16",
                      clamp=False, pair=None):
  """Fills k_smem [2, 64, 256] bf16 (k_tile_transforms()) with rows idx_ref[0 .. 63] of the
  packed pool: kv_ref [N, 512] uint8, rope_ref [N, 64] bf16, idx_ref [64] int32 (all in global
  memory), num_valid an int32 scalar. Called by one whole warpgroup; the caller fences
  (`plgpu.commit_smem`) and synchronizes before the tile is read. math: MATHS. clamp: indices
  are clamped into 0 .. N - 1 here (else the caller has).

  pair: (rank, ready_ref, tile) when two CTAs of a cluster share the block (mosaic.pair):
  this one (rank 0 or 1 in the cluster) loads rows 32 rank .. 32 rank + 31 only and writes
  each into its own k_smem and, with st.async, into the same place of the peer's, whose
  barrier ready_ref[tile] counts the PEER_BYTES that land there."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  if math not in MATHS:
    raise ValueError(f"math must be one of {MATHS}, got {math!r}")
  scalar = plgpu.Layout.WG_SPLAT(shape=())
  arg_types = (read_only_ref_type(),) * 3 + (scalar, plgpu.RefType(k_tile_transforms()))
  if pair is not None:  # rank, ready_ref, tile
    arg_types += (scalar, plgpu.RefType(), scalar)

  @plgpu.inline_mgpu(arg_types=arg_types)
  def fill(ctx, kv, rope, idx, valid_count, k, *pair_args):
    del ctx
    peer = None
    if pair_args:
      rank, ready, tile = pair_args
      peer = (rank.registers.flat[0], barrier_address(ready, tile.registers.flat[0]))
    _emit_fill(kv, rope, valid_count.registers.flat[0], k, math, idx=idx, clamp=clamp,
               peer=peer, loads=K_LOAD_QUALIFIERS[peer is not None])

  fill(kv_ref, rope_ref, idx_ref, num_valid, k_smem, *(pair or ()))


def carried_type(paired):
  """The loaded words the pipelined producer carries between blocks (gather_issue's and
  gather_step's result): CARRIED_GROUPS[paired] row groups' words per lane, an int32 array
  laid out one lane's words after another (its values mean nothing outside gather_step)."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  shape = (128 * CARRIED_GROUPS[paired] * WORDS_PER_GROUP,)
  return plgpu.ShapeDtypeStruct(shape, jnp.int32,
                                layout=plgpu.Layout.WG_STRIDED(shape, vec_size=4))


def step_schedule(groups, carried, issue_after=False):
  """gather_step's order for a block of `groups` row groups per warp with `carried` groups'
  loads carried in: ("issue", (block offset, group)) and ("convert", group) actions. Group
  g + carried's loads (in this block, offset 0, or the next, 1) are issued just before group g
  converts, or with issue_after just after, when g's words are dead."""
  if not 0 < carried <= groups:
    raise ValueError(f"carried must be 1 .. {groups} row groups, got {carried}")
  actions = []
  for g in range(groups):
    issue, convert = ("issue", divmod(g + carried, groups)), ("convert", g)
    actions += [convert, issue] if issue_after else [issue, convert]
  return actions


def gather_issue(kv_ref, rope_ref, idx_ref, num_valid, *, clamp=False, rank=None):
  """Issues the loads of a block's first CARRIED_GROUPS[paired] row groups (gather_dequantize's
  arguments) and returns them for gather_step: the pipelined producer's prologue. rank: this
  CTA's rank in its pair (its half of the rows), or None unpaired."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  scalar = plgpu.Layout.WG_SPLAT(shape=())
  arg_types = (read_only_ref_type(),) * 3 + (scalar,)
  if rank is not None:
    arg_types += (scalar,)

  paired = rank is not None

  @plgpu.inline_mgpu(arg_types=arg_types, return_type=carried_type(paired))
  def issue(ctx, kv, rope, idx, valid_count, *rank_arg):
    del ctx
    emit = _FillEmitter(kv, rope, None, "bf16",
                        peer=(rank_arg[0].registers.flat[0], None) if rank_arg else None,
                        loads=K_LOAD_QUALIFIERS[paired])
    count = valid_count.registers.flat[0]
    return _pack_carried([w for g in range(CARRIED_GROUPS[paired])
                          for w in emit.issue(g, count, idx=idx, clamp=clamp)], paired)

  return issue(kv_ref, rope_ref, idx_ref, num_valid, *(() if rank is None else (rank,)))


def gather_step(kv_ref, rope_ref, idx_ref, num_valid, next_idx_ref, next_num_valid, k_smem,
                carried, *, clamp=False, rank=None):
  """gather_dequantize of one block with its loads issued ahead: `carried` holds the loads of
  this block's first CARRIED_GROUPS[paired] row groups (gather_issue's, or the previous step's
  result); this converts every group of the block into k_smem, issuing each later group's
  loads (this block's rest, then the next block's first groups: next_idx_ref,
  next_num_valid) one group before it is needed, and returns the next block's carried loads.
  So a lane's loads are in flight while it converts, instead of each block waiting for its
  own. With no next block pass next_num_valid 0 and any readable next_idx_ref (its first
  entry is read): its loads then read pool row 0. rank: gather_issue's; a pair's CTA stores its
  half of the rows into its own tile only, and mosaic.pair.copy_to_peer sends them on."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  scalar = plgpu.Layout.WG_SPLAT(shape=())
  paired = rank is not None
  arg_types = (read_only_ref_type(),) * 3 + (scalar, read_only_ref_type(), scalar,
                                             plgpu.RefType(k_tile_transforms()),
                                             carried_type(paired).layout)
  if paired:
    arg_types += (scalar,)
  carried_groups = CARRIED_GROUPS[paired]

  @plgpu.inline_mgpu(arg_types=arg_types, return_type=carried_type(paired))
  def step(ctx, kv, rope, idx, valid_count, next_idx, next_valid_count, k, loaded,
           *rank_arg):
    del ctx
    emit = _FillEmitter(kv, rope, k, "bf16",
                        peer=(rank_arg[0].registers.flat[0], None) if rank_arg else None,
                        loads=K_LOAD_QUALIFIERS[paired])
    count, next_count = valid_count.registers.flat[0], next_valid_count.registers.flat[0]
    words = _unpack_carried(loaded)
    queue = [words[g * WORDS_PER_GROUP:(g + 1) * WORDS_PER_GROUP] for g in range(carried_groups)]
    for action, arg in step_schedule(emit.groups, carried_groups, ISSUE_AFTER_CONVERT[paired]):
      if action == "convert":
        emit.convert(arg, count, queue.pop(0))
      else:
        next_block, group = arg
        queue.append(emit.issue(group, next_count if next_block else count,
                                idx=next_idx if next_block else idx, clamp=clamp))
    return _pack_carried([w for group in queue for w in group], paired)

  return step(kv_ref, rope_ref, idx_ref, num_valid, next_idx_ref, next_num_valid, k_smem,
              carried, *(() if rank is None else (rank,)))


def _pack_carried(words, paired):
  """A lane's i32 words -> carried_type(paired)'s FragmentedArray (vectors of four)."""
  # pylint: disable=import-outside-toplevel
  import numpy as np
  from jax.experimental.mosaic import gpu as mgpu
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import llvm
  i32 = ir.IntegerType.get_signless(32)
  vec = ir.VectorType.get((4,), i32)
  registers = []
  for first in range(0, len(words), 4):
    reg = llvm.mlir_undef(vec)
    for i, w in enumerate(words[first:first + 4]):
      reg = llvm.insertelement(reg, w, mgpu_utils.c(i, i32))
    registers.append(reg)
  shape = carried_type(paired).shape
  return mgpu.FragmentedArray(_registers=np.array(registers, dtype=object),
                              _layout=mgpu.WGStridedFragLayout(shape, vec_size=4),
                              _is_signed=True)


def _unpack_carried(array):
  """_pack_carried's inverse: the lane's i32 words."""
  # pylint: disable=import-outside-toplevel
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import llvm
  i32 = ir.IntegerType.get_signless(32)
  return [llvm.extractelement(reg, mgpu_utils.c(i, i32))
          for reg in array.registers.flat for i in range(4)]


def barrier_address(ref, index):
  """The shared::cta address (i32) of mbarrier `index` (i32) of an int32 SMEM ref holding
  8-byte mbarriers (mosaic_pair.ready_barriers)."""
  # pylint: disable=import-outside-toplevel
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import arith, llvm
  i32 = ir.IntegerType.get_signless(32)
  base = llvm.ptrtoint(i32, mgpu_utils.memref_ptr(ref))
  return arith.addi(base, arith.muli(index, mgpu_utils.c(8, i32)))


def gather_consecutive(rows_ref, rope_ref, first_row, num_valid, smem):
  """gather_dequantize for rows first_row .. first_row + 63 of packed rows (rows_ref [N, 512]
  uint8, rope_ref [N, 64] bf16): the packed fp8 Q of a block of query rows, dequantized into
  a tile shaped like K's. Rows at or past num_valid are zeros and not read."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel

  @plgpu.inline_mgpu(arg_types=(read_only_ref_type(), read_only_ref_type(),
                                plgpu.Layout.WG_SPLAT(shape=()),
                                plgpu.Layout.WG_SPLAT(shape=()),
                                plgpu.RefType(k_tile_transforms())))
  def fill(ctx, rows, rope, first, valid_count, tile):
    del ctx
    _emit_fill(rows, rope, valid_count.registers.flat[0], tile, "f32",
               first_row=first.registers.flat[0])

  fill(rows_ref, rope_ref, first_row, num_valid, smem)


# Float rows (float Q): dtypes copy_consecutive reads, and the row groups of each whose loads are
# issued before any is stored (64 loaded words per thread either way: 8 lines of 64 values per
# row, a 16-byte chunk of bf16 or two of f32 per line).
FLOAT_GROUPS_IN_FLIGHT = {"bfloat16": 2, "float32": 1}
FLOAT_LINE = 2 * TILE_COLS  # 64 values: two swizzle tiles' columns, 128 bytes of bf16
FLOAT_LINES = layout.HEAD_DIM // FLOAT_LINE  # 8


def float_line_columns(piece, line):
  """(half, first column) of the one 8-column store of RoPE-style piece `piece` (lane_work's
  third) of float line `line` (a Python int): dims FLOAT_LINE line + 8 piece .. + 7. piece: a
  Python int (tests) or an _Int."""
  half, first_col = divmod(line * FLOAT_LINE, HALF)
  return half, piece * 8 + first_col


def copy_consecutive(rows_ref, first_row, num_valid, smem):
  """gather_consecutive for float rows: rows first_row .. first_row + 63 of rows_ref [N, 512]
  bf16 or f32 (Q as the model holds it, RoPE in dims 448..511) into a tile shaped like K's,
  bf16 (f32 rounded to nearest even, cvt.rn.bf16x2.f32). Rows at or past num_valid are zeros
  and not read. Called by one whole warpgroup; the caller fences before the tile is read.

  Each row is 8 lines of 64 values, moved like the RoPE line of gather_dequantize (lane_work's
  RoPE pieces: a warp-wide load reads four rows' lines whole for bf16, and each quarter-warp's
  16-byte stores are conflict-free): a lane moves 8 consecutive values of each line."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  dtype = _float_dtype(rows_ref)

  @plgpu.inline_mgpu(arg_types=(read_only_ref_type(), plgpu.Layout.WG_SPLAT(shape=()),
                                plgpu.Layout.WG_SPLAT(shape=()),
                                plgpu.RefType(k_tile_transforms())))
  def fill(ctx, rows, first, valid_count, tile):
    del ctx
    _emit_copy(rows, valid_count.registers.flat[0], tile, dtype,
               first_row=first.registers.flat[0])

  fill(rows_ref, first_row, num_valid, smem)


def gather_float(kv_ref, idx_ref, num_valid, k_smem, *, clamp=False, pair=None):
  """gather_dequantize for a float pool (a bf16 or f32 window cache, RoPE in dims 448..511):
  rows idx_ref[0 .. 63] of kv_ref [N, 512] bf16 or f32 into k_smem, bf16 copied as it is, f32
  rounded to nearest even (cvt.rn.bf16x2.f32); rows at or past num_valid are zeros and their
  index is not read. Moved as copy_consecutive moves float Q; clamp and pair as
  gather_dequantize's (a pair's CTA sends its peer the same PEER_BYTES)."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  dtype = _float_dtype(kv_ref)
  scalar = plgpu.Layout.WG_SPLAT(shape=())
  arg_types = (read_only_ref_type(), read_only_ref_type(), scalar,
               plgpu.RefType(k_tile_transforms()))
  if pair is not None:  # rank, ready_ref, tile
    arg_types += (scalar, plgpu.RefType(), scalar)

  @plgpu.inline_mgpu(arg_types=arg_types)
  def fill(ctx, kv, idx, valid_count, k, *pair_args):
    del ctx
    peer = None
    if pair_args:
      rank, ready, tile = pair_args
      peer = (rank.registers.flat[0], barrier_address(ready, tile.registers.flat[0]))
    _emit_copy(kv, valid_count.registers.flat[0], k, dtype, idx=idx, clamp=clamp, peer=peer)

  fill(kv_ref, idx_ref, num_valid, k_smem, *(pair or ()))


def _float_dtype(rows_ref):
  """The dtype name of float rows [N, 512] (bf16 or f32); anything else raises."""
  dtype = str(rows_ref.dtype)
  if dtype not in FLOAT_GROUPS_IN_FLIGHT or tuple(rows_ref.shape[1:]) != (layout.HEAD_DIM,):
    raise ValueError(f"float rows must be bf16 or f32 [N, {layout.HEAD_DIM}]; got {dtype} "
                     f"{tuple(rows_ref.shape)}")
  return dtype


def _emit_copy(rows, valid_count, k, dtype, *, first_row=None, idx=None, clamp=False,
               peer=None):
  """copy_consecutive's and gather_float's IR: rows first_row + r (or idx[r]) for
  r < valid_count (row first_row's place, or pool row 0, is read for the others, and zeros
  stored). peer: as _emit_fill's (half the rows, each stored here and in the peer)."""
  # pylint: disable=import-outside-toplevel
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import arith, llvm

  i32 = ir.IntegerType.get_signless(32)
  i64 = ir.IntegerType.get_signless(64)
  c32 = lambda v: mgpu_utils.c(v, i32)
  zero = c32(0)
  value_bytes = 2 if dtype == "bfloat16" else 4

  def add(a, b):
    return arith.addi(a, mgpu_utils.c(b, a.type) if isinstance(b, int) else b)

  def to_bf16x2(lo, hi):
    """Two f32 words -> one word of two bf16 (lo at the lower address), rounded to nearest."""
    return _asm(1, [hi, lo], "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f")[0]

  rows_base = llvm.ptrtoint(i64, mgpu_utils.memref_ptr(rows))
  k_base = llvm.ptrtoint(i32, mgpu_utils.memref_ptr(k))
  window = None
  if peer is not None:
    rank, barrier = peer
    window = _peer_window(k_base, rank, barrier)
  f32 = ir.F32Type.get()
  warp, (row_in_group, _, piece) = _lane_roles()
  piece_bytes = arith.extui(i64, arith.muli(piece, c32(8 * value_bytes)))

  groups = groups_per_warp(peer is not None)
  in_flight = FLOAT_GROUPS_IN_FLIGHT[dtype]
  for first in range(0, groups, in_flight):
    loaded = []
    for g in range(first, first + in_flight):  # every load of these groups first
      row = block_row(_Int(warp), g, _Int(row_in_group),
                      None if peer is None else _Int(rank)).value
      valid = arith.cmpi(arith.CmpIPredicate.slt, row, valid_count)
      if idx is None:
        entry = arith.extui(i64, add(first_row, arith.select(valid, row, zero)))
      else:
        entry = _listed_entry(idx, row, valid, zero, rows if clamp else None)
      row_address = add(add(rows_base, arith.muli(entry, mgpu_utils.c(
          layout.HEAD_DIM * value_bytes, i64))), piece_bytes)
      data = []
      for j in range(FLOAT_LINES):
        line_address = add(row_address, j * FLOAT_LINE * value_bytes)
        words = _load16(line_address)
        if value_bytes == 4:
          words += _load16(add(line_address, CHUNK))
        data.append(words)
      loaded.append((row, valid, data))
    for row, valid, data in loaded:
      for j, words in enumerate(data):
        if value_bytes == 4:
          words = [to_bf16x2(*(arith.bitcast(f32, w) for w in words[i:i + 2]))
                   for i in range(0, 8, 2)]
        half, col = float_line_columns(_Int(piece), j)
        address = add(k_base, k_tile_offset(_Int(c32(half)), _Int(row), col).value)
        _store16(address, [arith.select(valid, w, zero) for w in words], window)


class _FillEmitter:
  """The fp8 gather's IR, in two halves per row group (lane_work): `issue` emits a group's
  global loads and returns the loaded words (WORDS_PER_GROUP), `convert` dequantizes them and
  stores them into the tile. The one-shot fill (_emit_fill) and the pipelined producer step
  (gather_step: the next block's loads in flight while this one is converted) share them."""

  def __init__(self, kv, rope, k, math, peer=None, loads=""):
    """peer: (this CTA's rank in its pair, the shared::cta address of the peer-written tile's
    barrier): half the rows, each stored here and in the peer (gather_dequantize's pair); the
    barrier None to store them here only (gather_step's). k: the tile (None to issue loads
    only). loads: the global loads' PTX qualifiers (K_LOAD_QUALIFIERS')."""
    # pylint: disable=import-outside-toplevel
    from jax.experimental.mosaic.gpu import utils as mgpu_utils
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import arith, llvm
    self.mgpu_utils, self.arith, self.llvm = mgpu_utils, arith, llvm
    self.i32 = ir.IntegerType.get_signless(32)
    self.i64 = ir.IntegerType.get_signless(64)
    self.f32 = ir.F32Type.get()
    self.math = math
    self.zero = self.c32(0)
    self.kv = kv
    self.kv_base = llvm.ptrtoint(self.i64, mgpu_utils.memref_ptr(kv))
    self.rope_base = llvm.ptrtoint(self.i64, mgpu_utils.memref_ptr(rope))
    self.k_base = None if k is None else llvm.ptrtoint(self.i32, mgpu_utils.memref_ptr(k))
    self.window = None
    self.rank = None
    if peer is not None:
      self.rank, barrier = peer
      if barrier is not None:
        self.window = _peer_window(self.k_base, self.rank, barrier)
    self.warp, (self.row_in_group, self.piece, self.rope_piece) = _lane_roles()
    self.piece_bytes = arith.extui(self.i64, arith.muli(self.piece, self.c32(CHUNK)))
    self.rope_bytes = arith.extui(self.i64, arith.muli(self.rope_piece, self.c32(CHUNK)))
    # Which of its line's two tiles the piece is in, and whether it holds fp8 in the last,
    # half-used line.
    self.second_tile = arith.divui(self.piece, self.c32(4))
    self.in_fp8 = arith.cmpi(arith.CmpIPredicate.ult, self.piece,
                             self.c32(layout.NOPE_DIM % LINE // CHUNK))
    self.groups = groups_per_warp(peer is not None)
    self.loads = loads

  def c32(self, v):
    return self.mgpu_utils.c(v, self.i32)

  def add(self, a, b):
    return self.arith.addi(a, self.mgpu_utils.c(b, a.type) if isinstance(b, int) else b)

  def row(self, group):
    """The block row this lane fills in row group `group`."""
    return block_row(_Int(self.warp), group, _Int(self.row_in_group),
                     None if self.rank is None else _Int(self.rank)).value

  def issue(self, group, valid_count, *, idx=None, first_row=None, clamp=False):
    """The loads of row group `group` of rows idx[r] (or first_row + r) for r < valid_count:
    WORDS_PER_GROUP words (the row's scales, its fp8 lines, its RoPE piece). An invalid row's
    index is not read (it may lie past the list): pool row 0 is read in its place."""
    arith = self.arith
    row = self.row(group)
    valid = arith.cmpi(arith.CmpIPredicate.slt, row, valid_count)
    if idx is None:
      entry = arith.extui(self.i64, arith.select(valid, self.add(first_row, row), self.zero))
    else:
      entry = _listed_entry(idx, row, valid, self.zero, self.kv if clamp else None)
    row_address = self.add(self.kv_base, arith.muli(entry, self.mgpu_utils.c(layout.ROW_BYTES,
                                                                              self.i64)))
    rope_address = self.add(self.rope_base, arith.muli(
        entry, self.mgpu_utils.c(2 * layout.ROPE_DIM, self.i64)))
    words = _load16(self.add(row_address, layout.SCALE_OFFSET), self.loads)
    for j in range(FP8_LINES):
      words += _load16(self.add(self.add(row_address, j * LINE), self.piece_bytes), self.loads)
    return words + _load16(self.add(rope_address, self.rope_bytes), self.loads)

  def convert(self, group, valid_count, words):
    """Dequantizes and stores row group `group`'s loaded words (issue's), zeros for a row at or
    past valid_count."""
    arith = self.arith
    row = self.row(group)
    valid = arith.cmpi(arith.CmpIPredicate.slt, row, valid_count)
    scales, data, rope_words = words[:4], words[4:4 + 4 * FP8_LINES], words[4 + 4 * FP8_LINES:]
    for j in range(FP8_LINES):
      # Line j holds tiles 2 j and 2 j + 1 (scale word j); the piece is dims j * LINE + 16 piece.
      out = self._dequantize16(data[4 * j:4 * j + 4], self._tile_scale(scales, j), valid)
      half, col = fp8_store_columns(_Int(self.piece), j)

      def store(out=out, half=half, col=col.value):
        self._store(half, row, col, out[:4])
        self._store(half, row, self.add(col, 8), out[4:])
      if j == FP8_LINES - 1:
        with self.mgpu_utils.when(self.in_fp8):
          store()
      else:
        store()
    col = self.add(arith.muli(self.rope_piece, self.c32(8)), ROPE_FIRST_COL)
    self._store(1, row, col, [arith.select(valid, x, self.zero) for x in rope_words])

  def _store(self, half, row, col, words):
    address = self.add(self.k_base, k_tile_offset(_Int(self.c32(half)), _Int(row),
                                                  _Int(col)).value)
    _store16(address, words, self.window)

  def _tile_scale(self, scales, word):
    """The f32 scale 2^(byte - 127) of tile 2 word + second_tile (byte 0: the subnormal
    2^-127, 255: NaN; kernel_math's e8m0_to_f32) from the row's 16 scale bytes (four words;
    the bytes are s0 s0 s1 s1 ..., so tile t's first copy is byte 2 t)."""
    arith, c32 = self.arith, self.c32
    byte = arith.andi(arith.shrui(scales[word], arith.muli(self.second_tile, c32(16))),
                      c32(0xFF))
    bits = arith.shli(byte, c32(23))
    bits = arith.select(arith.cmpi(arith.CmpIPredicate.eq, byte, c32(0)), c32(0x00400000), bits)
    bits = arith.select(arith.cmpi(arith.CmpIPredicate.eq, byte, c32(255)), c32(0x7FC00000),
                        bits)
    if self.math == "bf16":  # the top half of the f32, in both halves of a word
      top = arith.shrui(bits, c32(16))
      return arith.ori(top, arith.shli(top, c32(16)))
    return arith.bitcast(self.f32, bits)

  def _dequantize16(self, words, scale, valid):
    """One 16-byte load of fp8 (four words) -> eight words of bf16, zeros for invalid rows."""
    if self.math == "none":
      out = list(words) * 2
    else:
      out = [o for w in words for o in self._fp8x4_to_bf16(w, scale)]
    return [self.arith.select(valid, o, self.zero) for o in out]

  def _fp8x4_to_bf16(self, word, scale):
    """Four e4m3 bytes -> two words of bf16 pairs, each value times scale (_tile_scale's)."""
    tail, constraints = _SCALED[self.math]
    return _asm(2, [word, scale], """{
      .reg .b16 lo, hi;
      .reg .b32 a, b, c, d;
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
      cvt.f32.f16 f3, b1;""" + tail + """
    }""", constraints)


# Four e4m3 bytes -> f32 f0..f3 (exact), then times the scale ($3) and rounded to two words of
# bf16 pairs ($0, $1): in f32 before rounding ("f32"), or in bf16x2 after ("bf16", $3 a word of
# two bf16).
_SCALED = {
    "f32": ("""
      mul.rn.f32 f0, f0, $3;
      mul.rn.f32 f1, f1, $3;
      mul.rn.f32 f2, f2, $3;
      mul.rn.f32 f3, f3, $3;
      cvt.rn.bf16x2.f32 $0, f1, f0;
      cvt.rn.bf16x2.f32 $1, f3, f2;""", "=r,=r,r,f"),
    "bf16": ("""
      cvt.rn.bf16x2.f32 c, f1, f0;
      cvt.rn.bf16x2.f32 d, f3, f2;
      mul.rn.bf16x2 $0, c, $3;
      mul.rn.bf16x2 $1, d, $3;""", "=r,=r,r,r"),
    "none": ("", ""),
}


def _emit_fill(kv, rope, valid_count, k, math, *, idx=None, first_row=None, clamp=False,
               peer=None, loads=""):
  """The one-shot gather's IR: rows idx[r] (or first_row + r) for r < valid_count, the loads of
  GROUPS_IN_FLIGHT row groups issued before any is converted. peer, loads: _FillEmitter's."""
  emit = _FillEmitter(kv, rope, k, math, peer, loads)
  for first in range(0, emit.groups, GROUPS_IN_FLIGHT):
    groups = range(first, first + GROUPS_IN_FLIGHT)
    loaded = [emit.issue(g, valid_count, idx=idx, first_row=first_row, clamp=clamp)
              for g in groups]
    for g, words in zip(groups, loaded):
      emit.convert(g, valid_count, words)


def _lane_roles():
  """This thread's warp in its warpgroup and its lane's work (lane_work), as i32 IR values:
  (warp, (row in a row group, fp8 piece, RoPE piece))."""
  # pylint: disable=import-outside-toplevel
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import arith, gpu
  i32 = ir.IntegerType.get_signless(32)
  lane_in_group = arith.remui(arith.index_cast(i32, gpu.thread_id(gpu.Dimension.x)),
                              mgpu_utils.c(128, i32))
  warp = arith.divui(lane_in_group, mgpu_utils.c(32, i32))
  return warp, tuple(x.value for x in lane_work(_Int(arith.remui(lane_in_group,
                                                                 mgpu_utils.c(32, i32)))))


def _asm(results, operands, text, constraints):
  """Inline PTX without side effects whose `results` outputs are i32 words, as a list."""
  # pylint: disable=import-outside-toplevel
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import llvm
  i32 = ir.IntegerType.get_signless(32)
  ty = i32 if results == 1 else llvm.StructType.get_literal([i32] * results)
  out = llvm.inline_asm(ty, operands, text, constraints, has_side_effects=False)
  return [out] if results == 1 else [llvm.extractvalue(i32, out, [i]) for i in range(results)]


def _load16(address, qualifiers=""):
  """Four words from global memory (the non-coherent path: the rows are read-only here)."""
  return _asm(4, [address], f"ld.global.nc{qualifiers}.v4.u32 {{$0, $1, $2, $3}}, [$4];",
              "=r,=r,=r,=r,l")


def _listed_entry(idx, row, valid, zero, clamp_to=None):
  """The i64 pool row of block row `row` (i32): idx[row], clamped into clamp_to's rows when
  given; for an invalid row 0, and its index not read (it may lie past the list)."""
  # pylint: disable=import-outside-toplevel
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import arith, memref
  position = arith.index_cast(ir.IndexType.get(), arith.select(valid, row, zero))
  entry = memref.load(idx, [position])
  if clamp_to is not None:
    last = mgpu_utils.c(ir.MemRefType(clamp_to.type).shape[0] - 1, zero.type)
    entry = arith.maxsi(arith.minsi(entry, last), zero)
  return arith.extui(ir.IntegerType.get_signless(64), arith.select(valid, entry, zero))


def _peer_window(k_base, rank, barrier):
  """(the offset from this CTA's K tile to the peer's, the peer's barrier address) in the
  cluster's shared window, for the CTA of rank `rank` (i32) in its pair."""
  # pylint: disable=import-outside-toplevel
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import arith, llvm
  i32 = ir.IntegerType.get_signless(32)
  other = arith.xori(rank, mgpu_utils.c(1, i32))

  def peer_address(address):
    return llvm.inline_asm(i32, [address, other], "mapa.shared::cluster.u32 $0, $1, $2;",
                           "=r,r,r", has_side_effects=False)
  # The peer's shared-memory window is contiguous: one mapping serves every offset.
  return arith.subi(peer_address(k_base), k_base), peer_address(barrier)


def _store16(address, words, window=None):
  """Four words into shared memory at `address` (i32); with a peer window (_peer_window) also
  into the peer's tile."""
  # pylint: disable=import-outside-toplevel
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import arith, llvm
  void = ir.Type.parse("!llvm.void")
  llvm.inline_asm(void, [address, *words], "st.shared.v4.b32 [$0], {$1, $2, $3, $4};",
                  "r,r,r,r,r", has_side_effects=True)
  if window is not None:
    # The same bytes at the same offset of the peer's tile; their arrival completes that many
    # bytes of the peer's barrier (as a TMA copy would), which orders them for its wgmma.
    offset, barrier = window
    llvm.inline_asm(void, [arith.addi(address, offset), *words, barrier],
                    "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 "
                    "[$0], {$1, $2, $3, $4}, [$5];", "r,r,r,r,r,r", has_side_effects=True)


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
