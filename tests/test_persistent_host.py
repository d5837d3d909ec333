"""The persistent path on the host backend: numerics against the float64 oracle, padding poison,
empty rows, sinks, return_lse, and the workspace counters after every call."""

import jax
import ml_dtypes
import numpy as np
import pytest

import jax_mla
from support.compare import assert_close
from jax_mla._src.aiter.persistent import (_WORKSPACE_FIELDS, decode_persistent,
                                            persistent_decode_p)
from jax_mla._src.workspace import make_workspace
from support.persistent_cases import check_against_oracle, empty_rows, inputs, run
from support.rows import make_batch

LENGTHS = {
    "ragged": [5, 0, 300, 1, 64, 0, 33, 97],
    "one_long": [1000],
    "all_empty": [0, 0, 0],
    "tile_edges": [31, 32, 33, 64, 65, 0, 1],
}


@pytest.mark.parametrize("num_partitions", [8, 64, 128, 1024])
@pytest.mark.parametrize("lengths", list(LENGTHS), ids=list(LENGTHS))
def test_matches_oracle(num_partitions, lengths):
  rng = np.random.default_rng(num_partitions + len(lengths))
  batch = make_batch(rng, num_heads=128, lengths=LENGTHS[lengths], pool_rows=700, sink=0.3,
                     extra_indices=5)
  out, lse, ws = run(batch, num_partitions=num_partitions)
  check_against_oracle(batch, out, lse)
  assert not np.asarray(ws.cnt).any(), "arrival counters must be zero after a completed call"


def test_rows_cut_over_many_partitions():
  # One 2000-token row over 8 partitions: 63 tiles, 8 pieces merged by the last arrival, plus
  # short rows that land wholly inside a partition.
  rng = np.random.default_rng(7)
  batch = make_batch(rng, num_heads=128, lengths=[3, 2000, 40, 0, 2], pool_rows=900, sink=-1.0)
  out, lse, ws = run(batch, num_partitions=8)
  check_against_oracle(batch, out, lse)
  desc = np.asarray(ws.desc)
  assert (desc[:, 6] > 0).sum() >= 7, f"the long row must be cut into pieces: desc={desc}"


SINKS = {"neg_inf": -np.inf, "finite": 0.75, "large": 60.0, "huge": 1e30, "pos_inf": np.inf}


@pytest.mark.parametrize("method", [True, "select", "scatter"])
def test_kernel_leaves_empty_rows_unwritten_and_the_fixup_covers_exactly_them(method):
  rng = np.random.default_rng(8)
  # Row 0 and the last row hold data: a sentinel or index off by one would hit them.
  batch = make_batch(rng, num_heads=128, lengths=[7, 0, 12, 0, 0, 90, 0, 3], pool_rows=200,
                     sink=1.5)
  empty = empty_rows(batch)
  written = np.setdiff1d(np.arange(8), empty)
  raw_out, raw_lse, _ = run(batch, raw=True, fix_empty_rows=False, fill_unwritten_nan=True)
  assert np.isnan(raw_out[empty]).all() and np.isnan(raw_lse[empty]).all()
  assert np.isfinite(raw_out[written]).all() and np.isfinite(raw_lse[written]).all()
  out, lse, _ = run(batch, raw=True, fix_empty_rows=method, fill_unwritten_nan=True)
  assert (out[empty] == 0).all()
  np.testing.assert_array_equal(lse[empty], np.broadcast_to(batch.sink, (len(empty), 128)))
  np.testing.assert_array_equal(out[written], raw_out[written])
  check_against_oracle(batch, out, lse)


def test_return_lse_false():
  rng = np.random.default_rng(10)
  batch = make_batch(rng, num_heads=128, lengths=[0, 30, 300], pool_rows=300, sink=0.2)
  out, lse, ws = run(batch, return_lse=False)
  assert lse is None
  with_lse, _, _ = run(batch)
  np.testing.assert_array_equal(out, with_lse)
  assert not np.asarray(ws.cnt).any()


def test_kv_indptr_with_offset_and_extra_indices():
  rng = np.random.default_rng(12)
  batch = make_batch(rng, num_heads=128, lengths=[10, 0, 50], pool_rows=100, extra_indices=9)
  batch.kv_indices = np.concatenate([rng.integers(0, 100, 6).astype(np.int32), batch.kv_indices])
  batch.kv_indptr = batch.kv_indptr + 6
  out, lse, _ = run(batch)
  check_against_oracle(batch, out, lse)


def test_out_of_range_kv_index_is_refused_naming_the_entry():
  rng = np.random.default_rng(13)
  batch = make_batch(rng, num_heads=128, lengths=[4, 6], pool_rows=20)
  batch.kv_indices[7] = 20
  with pytest.raises(jax.errors.JaxRuntimeError, match=r"kv_indices\[7\] = 20 \(row 1\)"):
    run(batch)
  batch.kv_indices[7] = -1
  with pytest.raises(jax.errors.JaxRuntimeError, match=r"kv_indices\[7\] = -1"):
    run(batch)


@pytest.mark.parametrize("lengths", ["ragged", "tile_edges"])
def test_agrees_with_the_split_host_path(lengths):
  rng = np.random.default_rng(99)
  batch = make_batch(rng, num_heads=128, lengths=LENGTHS[lengths], pool_rows=400, sink=0.4)
  out, lse, _ = run(batch, num_partitions=8)
  split_out, split_lse = jax.jit(lambda *a: jax_mla.decode(*a, backend="host"))(*batch.args())
  split_out = np.asarray(split_out.astype(np.float32))
  scale = np.abs(split_out).max()
  # Two different splits and merges: a couple of bf16 ulps apart, never more.
  assert_close("out vs split", out, split_out, atol=scale * 2.0**-7, rtol=2.0**-8, cos_tol=1e-5)
  assert_close("lse vs split", lse, np.asarray(split_lse), atol=1e-4 * max(1, np.abs(lse).max()),
               rtol=1e-5, cos_tol=None)


def test_eager_call_without_jit():
  batch = make_batch(np.random.default_rng(31), num_heads=128, lengths=[3, 0, 50], pool_rows=60,
                     sink=0.2)
  out, lse, ws = decode_persistent(*inputs(batch), make_workspace(8, 3))
  check_against_oracle(batch, np.asarray(out.astype(np.float32)), np.asarray(lse))
  assert not np.asarray(ws.cnt).any()


def test_zero_rows():
  args = (np.zeros((0, 128, 512), np.uint8), np.zeros((0, 128, 64), ml_dtypes.bfloat16),
          np.zeros((4, 512), np.uint8), np.zeros((4, 64), ml_dtypes.bfloat16), np.zeros((1,), np.int32),
          np.zeros((0,), np.int32), np.zeros((128,), np.float32))
  out, lse, _ = decode_persistent(*args, make_workspace(8, 4))
  assert out.shape == (0, 128, 512) and lse.shape == (0, 128)


def test_all_rows_empty_with_no_indices_and_no_kv_rows():
  # Zero-element kv_indices / kv / kv_rope may arrive with null addresses.
  n = 3
  args = (np.zeros((n, 128, 512), np.uint8), np.zeros((n, 128, 64), ml_dtypes.bfloat16),
          np.zeros((0, 512), np.uint8), np.zeros((0, 64), ml_dtypes.bfloat16),
          np.zeros((n + 1,), np.int32), np.zeros((0,), np.int32),
          np.full((128,), 0.5, np.float32))
  out, lse, ws = jax.jit(lambda ws, *a: decode_persistent(*a, ws))(make_workspace(8, n), *args)
  assert (np.asarray(out.astype(np.float32)) == 0).all() and (np.asarray(lse) == 0.5).all()
  assert not np.asarray(ws.cnt).any()


def test_second_copy_of_each_scale_byte_is_never_read():
  batch = make_batch(np.random.default_rng(40), num_heads=128, lengths=[9, 70, 0], pool_rows=90,
                     sink=0.1)
  clean_out, clean_lse, _ = run(batch)
  for packed in (batch.q, batch.kv):
    packed[..., 449:462:2] = 0xFF  # the duplicates s0 s0 s1 s1 ...: e8m0 NaN if read
  out, lse, _ = run(batch)
  np.testing.assert_array_equal(out, clean_out)
  np.testing.assert_array_equal(lse, clean_lse)


@pytest.mark.parametrize("operand,bad,match", [
    (6, np.zeros(129, np.float32), r"sink \(operand 6\) has dtype f32 dims \[129\]; expected "
                                   r"f32 dims \[128\]"),
    (0, None, r"q \(operand 0\) has dtype s8 .*expected u8"),
])
def test_handler_rechecks_operands(operand, bad, match):
  """The C++ handler refuses what the Python side would never send (bind called directly)."""
  batch = make_batch(np.random.default_rng(41), num_heads=128, lengths=[3, 4], pool_rows=16)
  workspace = make_workspace(8, 2, allow_any_partitions=True)
  operands = list(inputs(batch)) + [getattr(workspace, f) for f in _WORKSPACE_FIELDS]
  operands[operand] = batch.q.view(np.int8) if bad is None else bad
  f = jax.jit(lambda *a: persistent_decode_p.bind(
      *a, backend="host", return_lse=True, fill_unwritten_nan=False,
      num_partitions=workspace.num_partitions))
  with pytest.raises(jax.errors.JaxRuntimeError, match=match):
    jax.block_until_ready(f(*operands))
