"""The Mosaic GPU kernel (NVIDIA Hopper) against the float64 oracle, and its lowering on the CPU.

The kernel uses TMA, mbarriers and wgmma, which have no interpret mode: the oracle tests run on
an sm90 GPU only (marked `gpu`; skipped with the reason elsewhere). What the CPU checks in CI is
that the kernel lowers for CUDA (shapes, layouts, shared-memory budget, barriers) for every
shape family the tests use.
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
  return jax.jit(functools.partial(md.mosaic_decode, tokens_per_seq=tokens_per_seq,
                                   num_kv_splits_=num_kv_splits, return_lse=return_lse))


def run(batch, num_kv_splits=None, return_lse=True):
  args = [*batch.args()[:-1], batch.sink_array()]
  out, lse = decoder(batch.tokens_per_seq, num_kv_splits, return_lse)(*args)
  return np.asarray(jnp.asarray(out, jnp.float32)), (None if lse is None else np.asarray(lse))


def abstract_args(batch):
  """The batch's decode arguments as shapes and dtypes, for lowering without running."""
  return [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in batch.args()]


def check_against_oracle(batch, out, lse):
  assert_bf16_decode_close(out, lse, *oracle_decode(*batch.args(), batch.tokens_per_seq))


# (heads, tokens, lengths, splits): 128 heads pair their CTAs, 64 and 16 x 4 do not; 40 splits
# take the merge kernel (pallas.merge.KERNEL_MERGE_MIN_SPLITS), 3 XLA's merge, 1 none.
SHAPES = [(16, 4, [5, 0, 150, 1], 1), (64, 1, [300, 2], 3), (128, 1, [5, 0, 150, 1], None),
          (128, 1, [300, 0, 2500], 40)]


@pytest.mark.parametrize("num_heads,tokens_per_seq,lengths,splits", SHAPES)
def test_lowers_for_cuda_on_any_machine(num_heads, tokens_per_seq, lengths, splits):
  args = abstract_args(make_batch(np.random.default_rng(1), num_heads=num_heads,
                                  tokens_per_seq=tokens_per_seq, lengths=lengths, sink=0.3))
  fn = functools.partial(md.mosaic_decode, tokens_per_seq=tokens_per_seq, num_kv_splits_=splits)
  module = export_for(fn, "cuda", *args,
                      custom_calls=["mosaic_gpu_v2", "__gpu$xla.gpu.triton"]).mlir_module()
  assert "mosaic_gpu" in module
  assert ("jax_mla_merge_partials" in module) == (splits == 40)


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("num_heads,tokens_per_seq,lengths,splits", SHAPES)
def test_matches_the_oracle(num_heads, tokens_per_seq, lengths, splits):
  rng = np.random.default_rng(num_heads * 10 + tokens_per_seq)
  batch = make_batch(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq, lengths=lengths,
                     pool_rows=4096, sink=0.3, extra_indices=7)
  out, lse = run(batch, num_kv_splits=splits)
  check_against_oracle(batch, out, lse)


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("pattern", ["random", "same", "last"])
@pytest.mark.parametrize("num_heads", [64, 128])
def test_repeated_and_unsorted_indices(pattern, num_heads):
  rng = np.random.default_rng(len(pattern))
  batch = make_batch(rng, num_heads=num_heads, lengths=[70, 3, 129], sink=0.1,
                     index_pattern=pattern)
  out, lse = run(batch, num_kv_splits=2)
  check_against_oracle(batch, out, lse)


def test_direct_register_split_fits_the_launch():
  """An increase past what the other warpgroups released waits forever (it hung on the H200
  with 200 + 160 + 152): the split sums to no more than the launch's registers."""
  from jax_mla._src.pallas.mosaic import consumer as mosaic_consumer  # pylint: disable=import-outside-toplevel
  from jax_mla._src.pallas.mosaic import kernel as mosaic_direct  # pylint: disable=import-outside-toplevel
  split = mosaic_direct.REGISTERS
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
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  from jax_mla._src.pallas.mosaic import gather as mg  # pylint: disable=import-outside-toplevel

  def body(rows_ref, params_ref, out_ref, smem):
    mg.copy_consecutive(rows_ref, params_ref[0], params_ref[1], smem)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, out_ref)
    plgpu.wait_smem_to_gmem(0)

  scratch = dict(smem=plgpu.SMEM((2, mg.BLOCK_ROWS, mg.HALF), jnp.bfloat16,
                                 transforms=mg.k_tile_transforms()))
  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((2, mg.BLOCK_ROWS, mg.HALF),
                                                          jnp.bfloat16),
                      scratch_types=scratch)(rows, params)


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


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("q_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("num_heads,tokens_per_seq,lengths,splits", SHAPES)
def test_float_q_matches_the_oracle(num_heads, tokens_per_seq, lengths, splits, q_dtype):
  """Float Q (q_rope None) on one source: the oracle on the Q values the kernel computes with
  (bf16 as given, f32 rounded to bf16)."""
  rng = np.random.default_rng(num_heads * 10 + tokens_per_seq)
  batch = make_batch(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq, lengths=lengths,
                     pool_rows=4096, sink=0.3, extra_indices=7)
  values = dequantize_rows(batch.q, batch.q_rope)
  q = np.asarray(jnp.asarray(values * (1 + 0.2 * rng.standard_normal(values.shape)),
                             jnp.dtype(q_dtype)))
  computed = np.asarray(jnp.asarray(jnp.asarray(q).astype(jnp.bfloat16), jnp.float32))
  out, lse = decoder(tokens_per_seq, splits)(q, None, *batch.args()[2:-1], batch.sink_array())
  keys = token_keys(dequantize_rows(batch.kv, batch.kv_rope), batch.kv_indptr,
                    batch.kv_indices, q.shape[0], tokens_per_seq)
  want = oracle_attend(computed, keys, batch.sink, 1 / np.sqrt(512))
  assert_bf16_decode_close(np.asarray(jnp.asarray(out, jnp.float32)), np.asarray(lse), *want)
