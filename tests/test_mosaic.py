"""The Mosaic GPU kernel (NVIDIA Hopper) against the float64 oracle, and its lowering on the CPU.

The oracle tests run in two modes: "hardware", on an sm90 GPU (marked `gpu`; skipped with the
reason elsewhere), and "interpret", on any machine: Mosaic GPU's interpret mode runs the
kernel's warpgroups as threads with race detection, its inline-IR leaves and a pair's
cross-CTA barriers replaced by stand-ins (support/mosaic_interpret.py), at every shape but the
40-split ones (minutes each). The CPU also checks that the kernel lowers for CUDA (shapes, layouts,
shared-memory budget, barriers) for every shape family the tests use.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from support.compare import assert_bf16_decode_close
from support.gpu_export import export_for
from support import mosaic_interpret
from support.mosaic_tile import k_tile_kernel
from jax_mla._src.pallas import merge as pallas_merge
from jax_mla._src.pallas.mosaic import decode as md
from support.oracle import dequantize_rows, oracle_attend, oracle_decode, token_keys
from support.rows import make_batch


def _hopper():
  try:
    dev = jax.devices()[0]
  except RuntimeError:
    return False
  return dev.platform == "gpu" and str(getattr(dev, "compute_capability", "")) == "9.0"


GPU = pytest.mark.skipif(not _hopper(), reason=f"needs an sm90 (Hopper) GPU; the default "
                         f"backend is {jax.default_backend()!r}")
@functools.lru_cache(maxsize=None)
def decoder(tokens_per_seq=1, num_kv_splits=None, return_lse=True):
  return functools.partial(md.mosaic_decode, tokens_per_seq=tokens_per_seq,
                           num_kv_splits_=num_kv_splits, return_lse=return_lse)


@functools.lru_cache(maxsize=None)
def _jitted(fn):
  return jax.jit(fn)


def call(mode, monkeypatch, fn, *args):
  """fn(*args): jitted on the GPU ("hardware"), or eagerly in Mosaic GPU's interpret mode."""
  if mode == "hardware":
    return _jitted(fn)(*args)
  with mosaic_interpret.interpreted(monkeypatch):
    return fn(*args)


def run(mode, monkeypatch, batch, num_kv_splits=None, return_lse=True):
  args = [*batch.args()[:-1], batch.sink_array()]
  out, lse = call(mode, monkeypatch, decoder(batch.tokens_per_seq, num_kv_splits, return_lse),
                  *args)
  return np.asarray(jnp.asarray(out, jnp.float32)), (None if lse is None else np.asarray(lse))


_INTERPRET_OK, _INTERPRET_WHY = mosaic_interpret.available()
INTERPRET = pytest.mark.skipif(not _INTERPRET_OK, reason=_INTERPRET_WHY)


def modes(interpret=True):
  """The modes a shape runs in: hardware, and interpret unless not asked."""
  hardware = pytest.param("hardware", marks=[pytest.mark.gpu, GPU], id="hardware")
  if not interpret:
    return [hardware]
  return [pytest.param("interpret", marks=INTERPRET, id="interpret"), hardware]


def few_splits(shape):
  """Whether interpret mode runs a shape of a table whose last entry is the split count: not at
  40 splits (minutes on the CPU; the merge kernel they take has its own interpret-mode tests)."""
  return shape[-1] is None or shape[-1] < 32


def with_modes(shapes, interpret=lambda shape: True):
  """(mode, *shape) parameters: each shape in hardware mode, and in interpret mode where
  interpret(shape) (it takes seconds per decode)."""
  return with_modes_by(shapes, [()], lambda shape, _: interpret(shape))


def with_modes_by(shapes, values, interpret):
  """with_modes over each shape and each tuple of `values` (appended to the shape's
  parameters and its id): interpret mode where interpret(shape, value)."""
  return [pytest.param(mode.values[0], *shape, *value, marks=mode.marks,
                       id="-".join([mode.id, str(i), *map(_param_id, value)]))
          for i, shape in enumerate(shapes) for value in values
          for mode in modes(interpret(shape, value))]


def _param_id(value):
  return "-".join(map(str, value)) if isinstance(value, tuple) else str(value)


def f32_at_first_shape(shape, value):
  """Interpret mode for the float-input tables: bf16 at every shape few_splits takes, f32 (the
  same kernel after one rounding, which the copy's own test checks bit for bit) at the first."""
  return few_splits(shape) and (value[0] == "bfloat16" or shape == SHAPES[0])


def abstract_args(batch):
  """The batch's decode arguments as shapes and dtypes, for lowering without running."""
  return [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in batch.args()]


def check_against_oracle(batch, out, lse):
  assert_bf16_decode_close(out, lse, *oracle_decode(*batch.args(), batch.tokens_per_seq))


# (heads, tokens, lengths, splits): 128 heads pair their CTAs, 64 and 16 x 4 do not; 40 splits
# take the merge kernel (pallas.merge.KERNEL_MERGE_MIN_SPLITS), 3 XLA's merge, 1 none; 32 heads
# fill half a row block, whose output (with 3 splits: split partials, merged by XLA from those
# 32 rows and an lse with its padding) the kernel writes without the padding rows.
SHAPES = [(16, 4, [5, 0, 150, 1], 1), (64, 1, [300, 2], 3), (128, 1, [5, 0, 150, 1], None),
          (128, 1, [300, 0, 2500], 40), (32, 1, [5, 0, 150, 1], 1), (32, 1, [300, 2], 3)]
FEW_ROWS_DEFAULT = pallas_merge.KERNEL_MERGE_MAX_ROWS


@pytest.fixture(autouse=True)
def xla_merges_below_32_splits(monkeypatch):
  """The tests' batches are small, so their 2 to 31 splits would take the merge kernel
  (pallas.merge.KERNEL_MERGE_MAX_ROWS); XLA's merge, which a decode of more rows takes, is
  what they check instead (here and in test_pallas_sources, which imports this).
  test_few_rows_take_the_merge_kernel checks the kernel's."""
  monkeypatch.setattr(pallas_merge, "KERNEL_MERGE_MAX_ROWS", 0)


@pytest.mark.parametrize("num_heads,tokens_per_seq,lengths,splits", SHAPES)
def test_lowers_for_cuda_on_any_machine(num_heads, tokens_per_seq, lengths, splits):
  args = abstract_args(make_batch(np.random.default_rng(1), num_heads=num_heads,
                                  tokens_per_seq=tokens_per_seq, lengths=lengths, sink=0.3))
  fn = functools.partial(md.mosaic_decode, tokens_per_seq=tokens_per_seq, num_kv_splits_=splits)
  module = export_for(fn, "cuda", *args,
                      custom_calls=["mosaic_gpu_v2", "__gpu$xla.gpu.triton"]).mlir_module()
  assert "mosaic_gpu" in module
  assert ("jax_mla_merge_partials" in module) == (splits == 40)


@pytest.mark.parametrize("mode,num_heads,tokens_per_seq,lengths,splits",
                         with_modes(SHAPES, few_splits))
def test_matches_the_oracle(mode, num_heads, tokens_per_seq, lengths, splits, monkeypatch):
  rng = np.random.default_rng(num_heads * 10 + tokens_per_seq)
  # A sink per head: each row's must be its head's (the kernel reads them per row).
  batch = make_batch(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq, lengths=lengths,
                     pool_rows=4096, sink=rng.normal(size=num_heads).astype(np.float32),
                     extra_indices=7)
  out, lse = run(mode, monkeypatch, batch, num_kv_splits=splits)
  check_against_oracle(batch, out, lse)


@pytest.mark.parametrize("mode,num_heads,tokens_per_seq",
                         with_modes([(64, 1), (16, 4), (32, 1)]))
def test_few_rows_take_the_merge_kernel(mode, num_heads, tokens_per_seq, monkeypatch):
  """2 sequences, 3 splits: 128 rows of one token at 64 heads, 128 of four tokens at 16 x 4, 64
  of which 32 padding at 32 heads, all at most KERNEL_MERGE_MAX_ROWS, so merge="auto" takes the
  merge kernel (its lowering says so; by head, only the real rows), against the oracle."""
  monkeypatch.setattr(pallas_merge, "KERNEL_MERGE_MAX_ROWS", FEW_ROWS_DEFAULT)
  rng = np.random.default_rng(5 + num_heads)
  batch = make_batch(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq, lengths=[300, 2],
                     pool_rows=4096, sink=rng.normal(size=num_heads).astype(np.float32),
                     extra_indices=7)
  fn = functools.partial(md.mosaic_decode, tokens_per_seq=tokens_per_seq, num_kv_splits_=3)
  module = export_for(fn, "cuda", *abstract_args(batch),
                      custom_calls=["mosaic_gpu_v2", "__gpu$xla.gpu.triton"]).mlir_module()
  assert "jax_mla_merge_partials" in module
  out, lse = run(mode, monkeypatch, batch, num_kv_splits=3)
  check_against_oracle(batch, out, lse)


# (heads, tokens, lengths, splits): unpaired CTAs with 2 splits run a sequence's splits as one
# cluster that merges them through distributed shared memory (mosaic.cluster_merge); an empty
# sequence and one shorter than a split leave splits that saw nothing.
CLUSTER_SHAPES = [(16, 4, [300, 0, 2, 129], 2), (32, 1, [300, 0, 2, 129], 2),
                  (64, 1, [5, 0, 150, 1], 2), (64, 1, [700, 64], 2)]


@pytest.mark.parametrize("num_heads,tokens_per_seq,lengths,splits", CLUSTER_SHAPES)
def test_cluster_merge_lowers_for_cuda_on_any_machine(num_heads, tokens_per_seq, lengths, splits):
  """The splits as one cluster: the kernel writes the final out and lse (no partials), so no
  merge runs after it."""
  batch = make_batch(np.random.default_rng(1), num_heads=num_heads,
                     tokens_per_seq=tokens_per_seq, lengths=lengths, sink=0.3)
  fn = functools.partial(md.mosaic_decode, tokens_per_seq=tokens_per_seq, num_kv_splits_=splits)
  assert splits in md.CLUSTER_MERGE_SPLITS
  exported = export_for(fn, "cuda", *abstract_args(batch),
                        custom_calls=["mosaic_gpu_v2", "__gpu$xla.gpu.triton"])
  module = exported.mlir_module()
  assert "mosaic_gpu" in module and "jax_mla_merge_partials" not in module
  # Nothing of the partials' shape anywhere ([B, S, 64, 512] bf16, their lse [B, S, 64]).
  num_seqs = len(lengths)
  assert f"tensor<{num_seqs}x{splits}x64x512xbf16>" not in module
  assert f"tensor<{num_seqs}x{splits}x64xf32>" not in module
  # A new partial: jit's cache would hand back fn's trace, made with the cluster merge.
  without = functools.partial(md.mosaic_decode, tokens_per_seq=tokens_per_seq,
                              num_kv_splits_=splits)
  with pytest.MonkeyPatch.context() as patch:  # the same splits through partials: they appear
    patch.setattr(md, "CLUSTER_MERGE_SPLITS", ())
    partials = export_for(without, "cuda", *abstract_args(batch),
                          custom_calls=["mosaic_gpu_v2", "__gpu$xla.gpu.triton"]).mlir_module()
  # One row block's partials hold only its real rows (32 at 32 heads).
  part_rows = min(num_heads * tokens_per_seq, 64)
  assert f"tensor<{num_seqs}x{splits}x{part_rows}x512xbf16>" in partials


@pytest.mark.parametrize("mode,num_heads,tokens_per_seq,lengths,splits",
                         with_modes(CLUSTER_SHAPES, interpret=lambda shape: False))
@pytest.mark.parametrize("sink", ["per_head", "none"])
def test_cluster_merge_matches_the_oracle(mode, num_heads, tokens_per_seq, lengths, splits,
                                          sink, monkeypatch):
  """Hardware only: Mosaic GPU's interpreter has no distributed shared memory."""
  rng = np.random.default_rng(num_heads + splits)
  sinks = (rng.normal(size=num_heads).astype(np.float32) if sink == "per_head"
           else np.full(num_heads, -np.inf, np.float32))
  batch = make_batch(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq, lengths=lengths,
                     pool_rows=4096, sink=sinks, extra_indices=7)
  out, lse = run(mode, monkeypatch, batch, num_kv_splits=splits)
  check_against_oracle(batch, out, lse)


@pytest.mark.parametrize("pattern", ["random", "same", "last"])
@pytest.mark.parametrize("mode,num_heads,tokens_per_seq", with_modes([(64, 1), (128, 1)]))
def test_repeated_and_unsorted_indices(pattern, mode, num_heads, tokens_per_seq, monkeypatch):
  rng = np.random.default_rng(len(pattern))
  batch = make_batch(rng, num_heads=num_heads, lengths=[70, 3, 129], sink=0.1,
                     index_pattern=pattern)
  out, lse = run(mode, monkeypatch, batch, num_kv_splits=2)
  check_against_oracle(batch, out, lse)


def test_direct_register_split_fits_the_launch():
  """An increase past what the other warpgroups released waits forever (it hung on the H200
  with 200 + 160 + 152): the split sums to no more than the launch's registers."""
  from jax_mla._src.pallas.mosaic import consumer as mosaic_consumer  # pylint: disable=import-outside-toplevel
  from jax_mla._src.pallas.mosaic import kernel as mosaic_direct  # pylint: disable=import-outside-toplevel
  assert sorted(mosaic_direct.REGISTERS) == [False, True]  # unpaired, paired
  for split in mosaic_direct.REGISTERS.values():
    assert sorted(split) == [0, 1, 2]
    assert sum(split.values()) <= mosaic_consumer.LAUNCH_REGISTERS
    assert all(r % 8 == 0 and 24 <= r <= 256 for r in split.values())


# --- Float Q (bf16 or f32 rows, q_rope None): mosaic.gather.copy_consecutive ---------------------

def float_copy_stores():
  """Every 16-byte store of copy_consecutive's work split: (warp, lane, its step, its address,
  the (row, first dim) it writes), as the kernel's loops issue them."""
  from jax_mla._src.pallas.mosaic import gather as mg  # pylint: disable=import-outside-toplevel
  stores = []
  for warp, lane in itertools.product(range(4), range(32)):
    row_in_group, _, piece = mg.lane_work(lane)
    for group in range(mg.groups_per_warp(False)):
      row = mg.block_row(warp, group, row_in_group)
      for line in range(mg.FLOAT_LINES):
        half, col = mg.float_line_columns(piece, line)
        stores.append((warp, lane, (group, line), mg.k_tile_offset(half, row, col),
                       (row, half * mg.HALF + col)))
  return stores


def test_float_copy_writes_every_chunk_once_with_its_dims_and_no_bank_conflicts():
  from jax_mla._src.pallas.mosaic import gather as mg  # pylint: disable=import-outside-toplevel
  stores = float_copy_stores()
  assert sorted(s[3] for s in stores) == list(range(0, 2 * 64 * mg.HALF * 2, 16))
  for _, lane, (_, line), _, (_, dim) in stores:  # a lane's piece of line j: dims 64 j + 8 p
    assert dim == line * mg.FLOAT_LINE + 8 * mg.lane_work(lane)[2]
  by_instruction = {}
  for warp, lane, step, address, _ in stores:
    by_instruction.setdefault((warp, step, lane // 8), []).append(address)
  for quarter_warp in by_instruction.values():  # one wavefront of 16-byte stores
    assert len(quarter_warp) == 8 and len({a % 128 // 16 for a in quarter_warp}) == 8


def copy_tile(rows, params):
  """The tile [2, 64, 256] bf16 that copy_consecutive fills from rows [N, 512] (bf16 or f32);
  params int32 [2]: the first row, the number of valid rows."""
  from jax_mla._src.pallas.mosaic import gather as mg  # pylint: disable=import-outside-toplevel
  return k_tile_kernel(lambda rows_ref, params_ref, smem: mg.copy_consecutive(
      rows_ref, params_ref[0], params_ref[1], smem), rows, params)


def float_rows(rng, dtype, num_rows=200):
  """Float rows with the awkward values: ties and near-ties of the bf16 rounding, subnormals,
  f32's largest (rounds to inf in bf16), infinities, NaN."""
  rows = (rng.standard_normal((num_rows, 512)) * 3).astype(np.float32)
  rows[0, :8] = [1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8), 2.0**-130, -(2.0**-140),
                 np.finfo(np.float32).max, np.inf, -np.inf]
  rows[1, 9] = np.nan
  return rows.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else rows


def copy_oracle(rows, first_row, num_valid):
  """numpy: rows first_row.. rounded to bf16 (nearest even), zeros past num_valid."""
  out = np.zeros((64, 512), ml_dtypes.bfloat16)
  out[:num_valid] = np.asarray(rows[first_row:first_row + num_valid]).astype(ml_dtypes.bfloat16)
  return np.stack([out[:, :256], out[:, 256:]])


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_float_copy_lowers_for_cuda_on_any_machine(dtype):
  args = (jax.ShapeDtypeStruct((200, 512), jnp.dtype(dtype)),
          jax.ShapeDtypeStruct((2,), jnp.int32))
  exported = export_for(copy_tile, "cuda", *args, custom_calls=["mosaic_gpu_v2"])
  assert "mosaic_gpu" in exported.mlir_module()


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("first_row,num_valid", [(0, 64), (1, 37), (136, 64), (199, 1)])
def test_float_copy_matches_numpy_bit_for_bit(dtype, first_row, num_valid):
  rng = np.random.default_rng(first_row + num_valid)
  rows = float_rows(rng, dtype)
  got = np.asarray(jax.jit(copy_tile)(rows, np.array([first_row, num_valid], np.int32)))
  want = copy_oracle(rows, first_row, num_valid)
  nan = np.isnan(want.astype(np.float32))
  assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
  assert np.array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])


@pytest.mark.parametrize("mode,num_heads,tokens_per_seq,lengths,splits,q_dtype",
                         with_modes_by(SHAPES, [("bfloat16",), ("float32",)], f32_at_first_shape))
def test_float_q_matches_the_oracle(mode, num_heads, tokens_per_seq, lengths, splits, q_dtype,
                                   monkeypatch):
  """Float Q (q_rope None) on one source: the oracle on the Q values the kernel computes with
  (bf16 as given, f32 rounded to bf16)."""
  rng = np.random.default_rng(num_heads * 10 + tokens_per_seq)
  batch = make_batch(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq, lengths=lengths,
                     pool_rows=4096, sink=0.3, extra_indices=7)
  values = dequantize_rows(batch.q, batch.q_rope)
  q = np.asarray(jnp.asarray(values * (1 + 0.2 * rng.standard_normal(values.shape)),
                             jnp.dtype(q_dtype)))
  computed = np.asarray(jnp.asarray(jnp.asarray(q).astype(jnp.bfloat16), jnp.float32))
  out, lse = call(mode, monkeypatch, decoder(tokens_per_seq, splits), q, None,
                  *batch.args()[2:-1], batch.sink_array())
  keys = token_keys(dequantize_rows(batch.kv, batch.kv_rope), batch.kv_indptr,
                    batch.kv_indices, q.shape[0], tokens_per_seq)
  want = oracle_attend(computed, keys, batch.sink, 1 / np.sqrt(512))
  assert_bf16_decode_close(np.asarray(jnp.asarray(out, jnp.float32)), np.asarray(lse), *want)


# --- Float pools (bf16 or f32 rows, kv_rope None): mosaic.gather.gather_float -------------------

def test_paired_float_gather_writes_every_chunk_once_and_sends_the_peer_its_bytes():
  """With paired CTAs each producer copies half the block's rows (rank r: rows 32 r .. 32 r +
  31) into both CTAs' tiles: the two halves together cover every chunk once, each CTA's part is
  the PEER_BYTES its peer's barrier expects, and each quarter-warp's stores stay conflict-free."""
  from jax_mla._src.pallas.mosaic import gather as mg  # pylint: disable=import-outside-toplevel
  addresses = []
  for rank in (0, 1):
    mine, by_instruction = [], {}
    for warp, lane in itertools.product(range(4), range(32)):
      row_in_group, _, piece = mg.lane_work(lane)
      for group in range(mg.groups_per_warp(True)):
        row = mg.block_row(warp, group, row_in_group, rank)
        assert rank * 32 <= row < rank * 32 + 32
        for line in range(mg.FLOAT_LINES):
          half, col = mg.float_line_columns(piece, line)
          mine.append(mg.k_tile_offset(half, row, col))
          by_instruction.setdefault((warp, group, line, lane // 8), []).append(mine[-1])
    assert len(mine) * mg.CHUNK == mg.PEER_BYTES
    for quarter_warp in by_instruction.values():
      assert len(quarter_warp) == 8 and len({a % 128 // 16 for a in quarter_warp}) == 8
    addresses += mine
  assert sorted(addresses) == list(range(0, 2 * 64 * mg.HALF * 2, 16))


def gather_float_tile(pool, idx, num_valid):
  """The tile [2, 64, 256] bf16 that gather_float fills (one warpgroup, one CTA, indices
  clamped) from a float pool [N, 512] with indices idx [64] and num_valid int32 [1]."""
  from jax_mla._src.pallas.mosaic import gather as mg  # pylint: disable=import-outside-toplevel
  return k_tile_kernel(lambda pool_ref, idx_ref, n_ref, smem: mg.gather_float(
      pool_ref, idx_ref, n_ref[0], smem, clamp=True), pool, idx, num_valid)


def gather_float_oracle(pool, idx, num_valid):
  """numpy: rows idx[r] (clamped into the pool) rounded to bf16 (nearest even), zeros from
  num_valid on."""
  out = np.zeros((64, 512), ml_dtypes.bfloat16)
  rows = np.clip(idx[:num_valid], 0, len(pool) - 1)
  out[:num_valid] = np.asarray(pool)[rows].astype(ml_dtypes.bfloat16)
  return np.stack([out[:, :256], out[:, 256:]])


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_float_gather_lowers_for_cuda_on_any_machine(dtype):
  args = (jax.ShapeDtypeStruct((200, 512), jnp.dtype(dtype)),
          jax.ShapeDtypeStruct((64,), jnp.int32), jax.ShapeDtypeStruct((1,), jnp.int32))
  exported = export_for(gather_float_tile, "cuda", *args, custom_calls=["mosaic_gpu_v2"])
  assert "mosaic_gpu" in exported.mlir_module()


def test_float_gather_rejects_other_dtypes():
  from jax_mla._src.pallas.mosaic import gather as mg  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match="bf16 or f32"):
    mg.gather_float(jax.ShapeDtypeStruct((64, 512), jnp.float16), None, 64, None)
  with pytest.raises(ValueError, match="bf16 or f32"):
    mg.gather_float(jax.ShapeDtypeStruct((64, 576), jnp.bfloat16), None, 64, None)


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("num_valid", [64, 37, 1, 0])
def test_float_gather_matches_numpy_bit_for_bit(dtype, num_valid):
  """Rows by index (repeats, out of range: clamped), the awkward values of float_rows (ties of
  the bf16 rounding, subnormals, inf, NaN), and rows never listed that hold NaN; rows from
  num_valid on are zeros whatever their index says."""
  rng = np.random.default_rng(num_valid)
  pool = float_rows(rng, dtype)
  idx = rng.integers(0, 150, size=64).astype(np.int32)
  idx[:4] = [0, 1, 0, 500]  # the awkward rows, a repeat, one past the pool (reads row 199)
  pool[150:199] = np.nan  # never listed
  idx[num_valid:] = 175  # past num_valid: never read
  got = np.asarray(jax.jit(gather_float_tile)(pool, idx, np.array([num_valid], np.int32)))
  want = gather_float_oracle(pool, idx, num_valid)
  nan = np.isnan(want.astype(np.float32))
  assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
  assert np.array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])


def float_pool_args(batch, dtype):
  """The batch's decode arguments with its pool as float rows (`dtype`, kv_rope None), and the
  pool's values the kernel computes with (rounded to bf16), float64."""
  values = dequantize_rows(batch.kv, batch.kv_rope)
  values = values * (1 + 0.2 * np.random.default_rng(0).standard_normal(values.shape))
  kv = np.asarray(jnp.asarray(values, jnp.dtype(dtype)))
  computed = np.asarray(jnp.asarray(jnp.asarray(kv).astype(jnp.bfloat16), jnp.float32),
                        np.float64)
  return (batch.q, batch.q_rope, kv, None, *batch.args()[4:-1], batch.sink_array()), computed


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("num_heads,tokens_per_seq,lengths,splits", SHAPES)
def test_float_pool_lowers_for_cuda_on_any_machine(num_heads, tokens_per_seq, lengths, splits,
                                                   dtype):
  """The float_kv option (the producer copies float rows: gather_float), in every kernel family
  (paired CTAs at 128 heads; 1, 3 and 40 splits)."""
  batch = make_batch(np.random.default_rng(1), num_heads=num_heads,
                     tokens_per_seq=tokens_per_seq, lengths=lengths, sink=0.3)
  args, _ = float_pool_args(batch, dtype)
  shapes = [None if a is None else jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype)
            for a in args]
  fn = functools.partial(md.mosaic_decode, tokens_per_seq=tokens_per_seq, num_kv_splits_=splits)
  module = export_for(fn, "cuda", *shapes,
                      custom_calls=["mosaic_gpu_v2", "__gpu$xla.gpu.triton"]).mlir_module()
  assert "mosaic_gpu" in module
  assert ("jax_mla_merge_partials" in module) == (splits == 40)


@pytest.mark.parametrize("forms,option", [
    (("packed", "packed"), None), (("bfloat16", "packed"), (True, False)),
    (("packed", "float32"), (False, True)), (("float32", "bfloat16"), (True, True)),
    (("bfloat16", None), (True, False)), (("packed", None), None)])
def test_the_kernel_gets_float_kv_only_for_float_pools(monkeypatch, forms, option):
  """float_kv is a static kernel option, passed only when a pool is float: packed pools call
  the kernel with the options they always had."""
  from jax_mla._src.pallas.mosaic import kernel as mk  # pylint: disable=import-outside-toplevel
  seen = []
  real = mk.kernel

  def spy(*args, **kwargs):
    seen.append(kwargs.get("float_kv"))
    return real(*args, **kwargs)
  monkeypatch.setattr(mk, "kernel", spy)
  batch = make_batch(np.random.default_rng(2), num_heads=64, lengths=[5, 70], sink=0.3)

  def pool(form):
    if form == "packed":
      return [jax.ShapeDtypeStruct(batch.kv.shape, jnp.uint8),
              jax.ShapeDtypeStruct(batch.kv_rope.shape, jnp.bfloat16)]
    return [jax.ShapeDtypeStruct(batch.kv.shape, jnp.dtype(form)), None]
  lists = [jax.ShapeDtypeStruct(np.shape(a), jnp.int32) for a in batch.args()[4:6]]
  args = [jax.ShapeDtypeStruct(batch.q.shape, jnp.uint8),
          jax.ShapeDtypeStruct(batch.q_rope.shape, jnp.bfloat16), *pool(forms[0]), *lists,
          jax.ShapeDtypeStruct((64,), jnp.float32)]
  extra = [] if forms[1] is None else [*pool(forms[1]), *lists]
  fn = lambda *a: md.mosaic_decode(*a[:7], tokens_per_seq=1, num_kv_splits_=2,
                                   extra=a[7:] or None)
  export_for(fn, "cuda", *args, *extra, custom_calls=["mosaic_gpu_v2"])
  assert seen and all(s == option for s in seen), seen


@pytest.mark.parametrize("mode,num_heads,tokens_per_seq,lengths,splits,dtype",
                         with_modes_by(SHAPES, [("bfloat16",), ("float32",)], f32_at_first_shape))
def test_float_pool_matches_the_oracle(mode, num_heads, tokens_per_seq, lengths, splits, dtype,
                                       monkeypatch):
  """A float pool (kv_rope None) on one source: the oracle on the pool values the kernel
  computes with (bf16 as given, f32 rounded to bf16)."""
  rng = np.random.default_rng(num_heads * 10 + tokens_per_seq)
  batch = make_batch(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq, lengths=lengths,
                     pool_rows=4096, sink=0.3, extra_indices=7)
  args, computed = float_pool_args(batch, dtype)
  out, lse = call(mode, monkeypatch, decoder(tokens_per_seq, splits), *args)
  keys = token_keys(computed, batch.kv_indptr, batch.kv_indices, batch.q.shape[0],
                    tokens_per_seq)
  want = oracle_attend(dequantize_rows(batch.q, batch.q_rope), keys, batch.sink,
                       1 / np.sqrt(512))
  assert_bf16_decode_close(np.asarray(jnp.asarray(out, jnp.float32)), np.asarray(lse), *want)
