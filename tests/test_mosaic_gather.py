"""mosaic_gather: per-thread gathering and dequantization of packed rows into the swizzled K
tile, against a numpy oracle (bit-exact); its lowering on any machine."""

import functools
import itertools
import os
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from support.gpu_export import export_for
from support.mosaic_tile import k_tile_kernel
from jax_mla._src import layout
from jax_mla._src.pallas.mosaic import gather as mg
from jax_mla._src.pallas.mosaic import pair as mosaic_pair
from test_mosaic import GPU

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import mosaic_ir  # noqa: E402  pylint: disable=wrong-import-position

POOL = 4096


def gather_tile(kv, rope, idx, num_valid, math="bf16"):
  """The K tile [2, 64, 256] bf16 that gather_dequantize fills (one warpgroup, one CTA)."""
  return k_tile_kernel(lambda kv_ref, rope_ref, idx_ref, n_ref, smem: mg.gather_dequantize(
      kv_ref, rope_ref, idx_ref, n_ref[0], smem, math=math), kv, rope, idx, num_valid)


def oracle(kv, rope, idx, num_valid):
  """numpy: fp8 bytes times 2^(scale byte - 127) in f32, rounded to bf16; rows past
  num_valid zero."""
  out = np.zeros((64, layout.HEAD_DIM), np.float32)
  for r in range(num_valid):
    row = kv[idx[r]]
    vals = row[:layout.NOPE_DIM].view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    exps = row[layout.SCALE_OFFSET:layout.SCALE_OFFSET + layout.SCALE_BYTES:2].astype(np.int64)
    scales = np.where(exps == 255, np.nan, np.ldexp(np.float32(1), exps - 127)).astype(np.float32)
    out[r, :layout.NOPE_DIM] = vals * np.repeat(scales, layout.TILE)
    out[r, layout.NOPE_DIM:] = rope[idx[r]].astype(np.float32)
  out = out.astype(ml_dtypes.bfloat16)
  return np.stack([out[:, :mg.HALF], out[:, mg.HALF:]])


def random_pool(rng):
  kv = rng.integers(0, 256, (POOL, layout.ROW_BYTES)).astype(np.uint8)
  kv[:, :layout.NOPE_DIM][(kv[:, :layout.NOPE_DIM] & 0x7F) == 0x7F] = 0  # no fp8 NaN codes
  exps = rng.integers(100, 140, (POOL, layout.NUM_TILES)).astype(np.uint8)
  exps[1, 0], exps[2, 3], exps[3, 6] = 0, 254, 1  # extremes: 2^-127 (subnormal), 2^127, 2^-126
  # Under 2^127 only fp8 values below 2 stay finite in bf16: clear their top exponent bit.
  kv[2, 3 * layout.TILE:4 * layout.TILE] &= 0xBF
  kv[:, layout.SCALE_OFFSET:layout.PAD_OFFSET] = np.repeat(exps, 2, axis=1)
  rope = rng.standard_normal((POOL, layout.ROPE_DIM)).astype(ml_dtypes.bfloat16)
  return kv, rope


def test_k_tile_offsets_cover_the_tile_once_in_16_byte_chunks():
  offsets = [mg.k_tile_offset(h, r, c)
             for h, r, c in itertools.product(range(2), range(64), range(0, mg.HALF, 8))]
  assert sorted(offsets) == list(range(0, 2 * 64 * mg.HALF * 2, 16))
  # Eight rows of one column chunk land in eight distinct 16-byte bank groups (no conflicts).
  banks = {mg.k_tile_offset(0, r, 40) % 128 for r in range(8)}
  assert len(banks) == 8


def all_stores(rank=None):
  """Every 16-byte store of gather_dequantize's work split: (warp, lane, its step, its address,
  the (row, dim) it writes first), in issue order per lane (rows, lines, then the RoPE
  piece). rank: one CTA's share of a paired block (its stores go to both CTAs)."""
  stores = []
  for warp, lane in itertools.product(range(4), range(32)):
    row_in_group, piece, rope_piece = mg.lane_work(lane)
    for group in range(mg.groups_per_warp(rank is not None)):
      row = mg.block_row(warp, group, row_in_group, rank)
      for line in range(mg.FP8_LINES):
        if line * mg.LINE + piece * 16 >= layout.NOPE_DIM:
          continue  # the last line's pieces past the fp8 data (scales, padding)
        half, col = mg.fp8_store_columns(piece, line)
        for c in (col, col + 8):
          stores.append((warp, lane, (group, line, c - col), mg.k_tile_offset(half, row, c),
                         (row, half * mg.HALF + c)))
      col = mg.ROPE_FIRST_COL + rope_piece * 8
      stores.append((warp, lane, (group, "rope", 0), mg.k_tile_offset(1, row, col),
                     (row, mg.HALF + col)))
  return stores


@pytest.mark.parametrize("ranks", [(None,), (0, 1)], ids=["alone", "paired"])
def test_work_split_writes_every_chunk_once_and_the_right_dims(ranks):
  stores = [s for rank in ranks for s in all_stores(rank)]
  assert sorted(s[3] for s in stores) == list(range(0, 2 * 64 * mg.HALF * 2, 16))
  # A piece's fp8 bytes are its dims: piece p of line j is dims 128 j + 16 p .. + 15.
  for warp, lane, (group, line, second), _, (row, dim) in stores:
    _, piece, rope_piece = mg.lane_work(lane)
    want = (layout.NOPE_DIM + rope_piece * 8 if line == "rope"
            else line * mg.LINE + piece * 16 + second)
    assert dim == want and row % (64 // len(ranks)) // (16 // len(ranks)) == warp
  # In a pair, each CTA sends its peer exactly the bytes the peer's barrier expects.
  for rank in ranks:
    if rank is not None:
      assert 16 * len(all_stores(rank)) == mg.PEER_BYTES


@pytest.mark.parametrize("rank", [0, 1])
def test_a_pairs_bulk_copy_sends_exactly_the_rows_its_cta_stored(rank):
  """mosaic.pair.copy_to_peer copies sent_range(rank, half) of both halves: every byte the
  CTA's producer stored, nothing the peer stores itself, PEER_BYTES in all."""
  stored = sorted(s[3] for s in all_stores(rank))
  sent = [a for half in range(2) for first, size in [mosaic_pair.sent_range(rank, half)]
          for a in range(first, first + size, 16)]
  assert stored == sent and 16 * len(sent) == mg.PEER_BYTES


@pytest.mark.parametrize("rank", [None, 0, 1])
def test_work_split_stores_and_loads_without_conflicts(rank):
  by_instruction = {}
  for warp, lane, step, address, _ in all_stores(rank):
    by_instruction.setdefault((warp, step, lane // 8), []).append(address)
  for quarter_warp in by_instruction.values():  # one wavefront of 16-byte stores
    assert len(quarter_warp) == 8 and len({a % 128 // 16 for a in quarter_warp}) == 8
  # Each warp-wide load reads four rows, eight 16-byte pieces of one 128-byte line each.
  pieces = [mg.lane_work(lane) for lane in range(32)]
  for which in (1, 2):  # fp8 pieces, RoPE pieces
    per_row = {}
    for w in pieces:
      per_row.setdefault(w[0], set()).add(w[which])
    assert per_row == {r: set(range(8)) for r in range(4)}


@pytest.mark.parametrize("math", mg.MATHS)
def test_lowers_for_cuda_on_any_machine(math):
  args = (jax.ShapeDtypeStruct((POOL, layout.ROW_BYTES), jnp.uint8),
          jax.ShapeDtypeStruct((POOL, layout.ROPE_DIM), jnp.bfloat16),
          jax.ShapeDtypeStruct((64,), jnp.int32), jax.ShapeDtypeStruct((1,), jnp.int32))
  exported = export_for(functools.partial(gather_tile, math=math), "cuda", *args,
                        custom_calls=["mosaic_gpu_v2"])
  assert "mosaic_gpu" in exported.mlir_module()


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("math", ["f32", "bf16"])
@pytest.mark.parametrize("num_valid", [64, 37, 0])
def test_matches_numpy_bit_for_bit(num_valid, math):
  rng = np.random.default_rng(num_valid)
  kv, rope = random_pool(rng)
  idx = rng.integers(0, POOL, 64).astype(np.int32)
  idx[:4] = [1, 2, 3, 1]  # the extreme scales, one row twice
  # Past num_valid the list holds an out-of-range index, which must not be read.
  idx[num_valid:] = 1 << 30
  got = np.asarray(jax.jit(functools.partial(gather_tile, math=math))(
      kv, rope, idx, np.array([num_valid], np.int32)))
  want = oracle(kv, rope, idx, num_valid)
  assert np.isfinite(want.astype(np.float32)).all()
  assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.gpu
@GPU
def test_nan_scale_gives_nan_tile():
  rng = np.random.default_rng(7)
  kv, rope = random_pool(rng)
  kv[5, layout.SCALE_OFFSET + 2 * 5:layout.SCALE_OFFSET + 2 * 5 + 2] = 255
  idx = np.full(64, 5, np.int32)
  got = np.asarray(jax.jit(gather_tile)(kv, rope, idx, np.array([64], np.int32)), np.float32)
  assert np.isnan(got[1, :, 64:128]).all()  # tile 5 is columns 64..127 of the second half
  assert np.isfinite(got[1, :, :64]).all() and np.isfinite(got[0]).all()


@pytest.mark.gpu
@GPU
def test_fp8_nan_codes_give_nan_and_nothing_else():
  rng = np.random.default_rng(11)
  kv, rope = random_pool(rng)
  kv[9, [0, 77, 300, 447]] = [0x7F, 0xFF, 0x7F, 0xFF]  # e4m3's two NaN codes, in three tiles
  idx = np.full(64, 9, np.int32)
  idx[1::2] = 10
  got = np.asarray(jax.jit(gather_tile)(kv, rope, idx, np.array([64], np.int32)), np.float32)
  full = np.concatenate([got[0], got[1]], axis=1)  # [64 rows, 512 dims]
  want_nan = np.zeros_like(full, bool)
  want_nan[0::2][:, [0, 77, 300, 447]] = True
  assert (np.isnan(full) == want_nan).all()


@pytest.mark.parametrize("issue_after", [False, True])
@pytest.mark.parametrize("paired", [False, True])
def test_pipelined_producer_loads_every_group_once_before_it_converts(paired, issue_after):
  """gather_step's schedule over consecutive blocks, applied as gather_step applies it
  (gather_issue's prologue first): each row group of each block is loaded exactly once, before
  its conversion, in block order, with at most CARRIED_GROUPS + 1 groups' words live (issued
  before the conversion) or CARRIED_GROUPS (issued after it, into the converted group's place)."""
  groups = mg.groups_per_warp(paired)
  carried = mg.CARRIED_GROUPS[paired]
  blocks = 3
  queue = [(0, g) for g in range(carried)]  # gather_issue: block 0's first groups
  loaded, converted = list(queue), []
  for block in range(blocks):
    actions = mg.step_schedule(groups, carried, issue_after)
    per_group = ["convert", "issue"] if issue_after else ["issue", "convert"]
    assert [a for a, _ in actions] == per_group * groups
    for action, arg in actions:
      if action == "issue":
        queue.append((block + arg[0], arg[1]))
        loaded.append((block + arg[0], arg[1]))
        assert len(queue) <= carried + (0 if issue_after else 1)
      else:
        assert queue.pop(0) == (block, arg)
        converted.append((block, arg))
  every = [(b, g) for b in range(blocks) for g in range(groups)]
  assert converted == every
  assert loaded[:len(every)] == every  # the rest: the block after the last, row 0 of the pool
  assert queue == [(blocks, g) for g in range(carried)]


def test_pipelined_producer_rejects_carrying_more_than_a_block():
  with pytest.raises(ValueError, match="carried"):
    mg.step_schedule(2, 3)


HINTED_LOAD = "ld.global.nc.L1::no_allocate.v4.u32"
PLAIN_LOAD = "ld.global.nc.v4.u32"


def _decode_module(config):
  texts = mosaic_ir.module_texts(*mosaic_ir.CONFIGS[config])
  assert len(texts) == 1, texts
  return texts[0]


def test_k_gather_loads_carry_their_kernels_cache_hint(monkeypatch):
  """K_LOAD_QUALIFIERS reaches every K gather load of its kernel and no other load: with the
  paired kernel's hint set, all its loads but Q's carry it, none is added or lost, and the
  unpaired kernel does not change."""
  q_loads = mg.groups_per_warp(False) * mg.WORDS_PER_GROUP // 4  # Q's block, gathered unpaired
  modules = {}
  for hint in ("", ".L1::no_allocate"):
    monkeypatch.setattr(mg, "K_LOAD_QUALIFIERS", {True: hint, False: ""})
    try:
      modules[hint] = _decode_module("paired"), _decode_module("unpaired")
    except mosaic_ir.ir.MLIRError as error:  # jax 0.11.2's bindings reject Mosaic's #gpu<dim x>
      pytest.skip(f"jax {jax.__version__} cannot parse the Mosaic module back: {error}")
  (plain, unpaired), (hinted, hinted_unpaired) = modules[""], modules[".L1::no_allocate"]
  assert HINTED_LOAD not in plain and HINTED_LOAD not in unpaired
  assert hinted_unpaired == unpaired
  assert hinted.count(PLAIN_LOAD) == q_loads
  assert hinted.count(HINTED_LOAD) + q_loads == plain.count(PLAIN_LOAD)
