"""The host backend (the C++ executor running the nm kernel's plan) against the float64 oracle,
with both of its CPU kernel families, and both endings: the executor's own merge (what the host
backend runs) and the XLA merge of the kernel's partials (what gfx950 runs).

Every call goes through jax.jit and the FFI, with fill_unwritten_nan on unless a test says
otherwise: whatever the executor leaves unwritten is NaN, so it cannot reach a result unseen.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from support.compare import assert_close
from support.oracle import oracle_decode
from support.rows import make_batch
from jax_mla._src.aiter import empty_rows
from jax_mla._src.aiter import split as split_kernel
from jax_mla._src.aiter.split import split_decode

SUPPORTED = [(16, 1), (16, 2), (16, 4), (32, 1), (64, 1), (128, 1)]
# Ragged: an empty sequence, rows shorter than S * 32, one with 5 tiles (S=4 leaves 3 valid).
LENGTHS = [0, 5, 70, 33, 150, 1]


@functools.lru_cache(maxsize=None)
def jitted(tokens_per_seq, num_kv_splits, return_lse, fill=True, merge=True):
  return jax.jit(functools.partial(
      split_decode, tokens_per_seq=tokens_per_seq, num_kv_splits=num_kv_splits, backend="host",
      return_lse=return_lse, fill_unwritten_nan=fill, merge_in_executor=merge))


def run(batch, num_kv_splits, *, return_lse=None, fill=True, merge=True):
  """(out f32, lse or None). merge: the executor's merge, else XLA's (no LSE at one split)."""
  if return_lse is None:
    return_lse = merge or num_kv_splits != 1
  args = batch.args()[:-1] + (batch.sink_array(),)
  out, lse = jitted(batch.tokens_per_seq, num_kv_splits, return_lse, fill, merge)(*args)
  return np.asarray(out.astype(jnp.float32)), None if lse is None else np.asarray(lse)


def check_against_oracle(batch, out, lse):
  want_out, want_lse = oracle_decode(*batch.args(), tokens_per_seq=batch.tokens_per_seq)
  scale = max(1.0, float(np.max(np.abs(want_out))))
  assert_close("out", out, want_out, atol=8e-3 * scale, rtol=5e-3, cos_tol=1e-4)
  if lse is not None:
    assert_close("lse", lse, want_lse, atol=1e-4, rtol=1e-5, cos_tol=None)


@pytest.mark.parametrize("merge", [True, False], ids=["executor_merge", "xla_merge"])
@pytest.mark.parametrize("num_kv_splits", [1, 2, 3, 8, 16, None], ids=lambda s: f"S{s}")
@pytest.mark.parametrize("gqa,msq", SUPPORTED, ids=lambda v: str(v))
def test_every_shape_and_split_count(gqa, msq, num_kv_splits, merge):
  rng = np.random.default_rng(gqa * 100 + msq * 10 + (num_kv_splits or 0))
  batch = make_batch(rng, num_heads=gqa, lengths=LENGTHS, tokens_per_seq=msq, pool_rows=200,
                     sink=rng.standard_normal(gqa).astype(np.float32))
  out, lse = run(batch, num_kv_splits, merge=merge)
  check_against_oracle(batch, out, lse)


@pytest.mark.parametrize("num_kv_splits", [1, 2, 3, 16])
@pytest.mark.parametrize("gqa,msq", [(16, 4), (128, 1)], ids=lambda v: str(v))
def test_executor_merge_agrees_with_the_xla_merge(gqa, msq, num_kv_splits):
  """Sinks at -inf, +inf and finite values, empty and one-entry sequences, and a NaN in a used
  row: the executor's merge has the XLA merge's NaN and infinity pattern, then its values (from
  the same partials: only the exp/log and the summation's rounding differ)."""
  rng = np.random.default_rng(7 * gqa + num_kv_splits)
  sink = rng.standard_normal(gqa).astype(np.float32)
  sink[:3] = [-np.inf, np.inf, 30.0]
  batch = make_batch(rng, num_heads=gqa, lengths=LENGTHS + [300], tokens_per_seq=msq,
                     pool_rows=1000, sink=sink, index_pattern="unique")
  batch.kv = batch.kv.copy()
  batch.kv[batch.kv_indices[batch.kv_indptr[4] + 100], 7] = 0x7F  # e4m3 NaN: sequence 4 only
  got_out, got_lse = run(batch, num_kv_splits, merge=True)
  want_out, want_lse = run(batch, max(num_kv_splits, 2), merge=False)  # XLA needs 2 for an LSE
  nan_tokens = np.zeros(got_out.shape[0], bool)
  nan_tokens[4 * msq:5 * msq] = True
  assert np.isnan(want_out[nan_tokens]).all() and np.isnan(want_lse[nan_tokens]).all()
  assert np.isfinite(want_out[~nan_tokens]).all()
  # Non-finite patterns first (NaN, +-inf alike), then the values: a bf16 ulp of the largest.
  scale = max(1.0, float(np.abs(want_out[~nan_tokens]).max()))
  assert_close("out", got_out, want_out, atol=scale * 2.0**-7, rtol=2.0**-8, cos_tol=1e-5)
  assert_close("lse", got_lse, want_lse, atol=1e-4 * 32, rtol=1e-5, cos_tol=None)
  # The +inf sink: out 0, lse +inf; an empty sequence: out 0, lse = sink.
  assert (got_out[~nan_tokens, 1] == 0).all() and (got_lse[~nan_tokens, 1] == np.inf).all()
  assert (got_out[:msq] == 0).all()
  np.testing.assert_array_equal(got_lse[:msq], np.broadcast_to(sink, (msq, gqa)))


def test_executor_merge_refuses_a_grid_that_leaves_rows():
  """The executor merges only what its tasks wrote: a qo_indptr whose rows no task owns is
  refused, not merged from unwritten partials."""
  rng = np.random.default_rng(3)
  batch = make_batch(rng, num_heads=16, lengths=[3, 4], pool_rows=16)
  seq = np.arange(3, dtype=np.int32)
  f = jax.jit(lambda *a: split_kernel.split_decode_p.bind(
      *a, num_kv_splits=2, tokens_per_seq=1, backend="host", fill_unwritten_nan=True,
      merge_in_executor=True))
  args = list(batch.args()[:-1]) + [batch.sink_array(), np.array([0, 1, 1], np.int32), seq * 2]
  with pytest.raises(jax.errors.JaxRuntimeError, match="merging needs a grid that runs every"):
    jax.block_until_ready(f(*args))


@pytest.mark.parametrize("pattern", ["random", "unique", "reversed", "same", "last"])
@pytest.mark.parametrize("num_kv_splits", [1, 5])
def test_index_patterns(pattern, num_kv_splits):
  rng = np.random.default_rng(11)
  batch = make_batch(rng, num_heads=32, lengths=[64, 31, 0, 129], pool_rows=300,
                     index_pattern=pattern, extra_indices=7, sink=-1.0)
  out, lse = run(batch, num_kv_splits)
  check_against_oracle(batch, out, lse)


def test_trailing_indices_are_never_read():
  rng = np.random.default_rng(5)
  batch = make_batch(rng, num_heads=16, lengths=[20, 45], pool_rows=64)
  clean = run(batch, 2)
  batch.kv_indices = np.concatenate([batch.kv_indices, [-7, 2**30, 64]]).astype(np.int32)
  poisoned = run(batch, 2)
  np.testing.assert_array_equal(clean[0], poisoned[0])
  np.testing.assert_array_equal(clean[1], poisoned[1])


def test_eight_heads_run_padded_to_sixteen():
  rng = np.random.default_rng(8)
  batch = make_batch(rng, num_heads=8, lengths=[33, 0, 70], pool_rows=128, sink=0.5)
  for num_kv_splits in (1, 3):
    out, lse = run(batch, num_kv_splits)
    assert out.shape == (3, 8, 512)
    check_against_oracle(batch, out, lse)


def test_second_scale_copies_are_not_read():
  """Only the first of each tile's two scale bytes counts: changing the second changes nothing."""
  rng = np.random.default_rng(4)
  batch = make_batch(rng, num_heads=16, lengths=[40, 7], pool_rows=64)
  clean = run(batch, 2)
  batch.q = batch.q.copy()
  batch.kv = batch.kv.copy()
  batch.q[..., 449:462:2] = 0xFF
  batch.kv[..., 449:462:2] = 0xFF
  out, lse = run(batch, 2)
  np.testing.assert_array_equal(out, clean[0])
  np.testing.assert_array_equal(lse, clean[1])


def kernel_results(batch, num_kv_splits, fill=True):
  """The raw primitive results (no merge)."""
  b = len(batch.kv_indptr) - 1
  seq = jnp.arange(b + 1, dtype=jnp.int32)

  @jax.jit
  def f(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink):
    return split_kernel.split_decode_p.bind(
        q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, seq * batch.tokens_per_seq,
        seq * num_kv_splits, num_kv_splits=num_kv_splits, tokens_per_seq=batch.tokens_per_seq,
        backend="host", fill_unwritten_nan=fill, merge_in_executor=False)
  return [np.asarray(r) for r in f(*batch.args()[:-1], batch.sink_array())]


def test_unwritten_partials_are_nan_and_never_reach_the_result():
  rng = np.random.default_rng(13)
  num_kv_splits = 4
  batch = make_batch(rng, num_heads=16, lengths=LENGTHS, pool_rows=200, sink=1.5)
  partials, partial_lse, valid = kernel_results(batch, num_kv_splits)
  lengths = np.diff(batch.kv_indptr)
  tiles = -(-lengths // 32)
  per_split = -(-tiles // num_kv_splits)
  want_valid = np.where(tiles == 0, 0, -(-tiles // np.maximum(per_split, 1)))
  np.testing.assert_array_equal(valid, want_valid)
  assert list(valid) == [0, 1, 3, 2, 3, 1]  # 150 tokens = 5 tiles: 3 splits of 2, 2, 1 tiles
  for b, count in enumerate(valid):
    assert np.isnan(partials[b, count:]).all() and np.isnan(partial_lse[b, count:]).all()
    assert np.isfinite(partials[b, :count]).all() and np.isfinite(partial_lse[b, :count]).all()
  out, lse = run(batch, num_kv_splits)
  assert np.isfinite(out).all() and np.isfinite(lse).all()
  check_against_oracle(batch, out, lse)


def test_single_split_leaves_empty_rows_unwritten_and_the_fixup_zeroes_them():
  rng = np.random.default_rng(17)
  batch = make_batch(rng, num_heads=16, lengths=[0, 12, 0], tokens_per_seq=2, pool_rows=32)
  (raw,) = kernel_results(batch, 1)
  raw = raw.astype(np.float32)
  assert np.isnan(raw[[0, 1, 4, 5]]).all() and np.isfinite(raw[[2, 3]]).all()
  out, _ = run(batch, 1)
  assert np.all(out[[0, 1, 4, 5]] == 0)
  check_against_oracle(batch, out, None)


def test_same_result_without_nan_fill():
  rng = np.random.default_rng(19)
  batch = make_batch(rng, num_heads=64, lengths=[33, 0, 64], pool_rows=64, sink=0.0)
  for num_kv_splits in (1, 3):
    with_fill = run(batch, num_kv_splits, fill=True)
    without = run(batch, num_kv_splits, fill=False)
    np.testing.assert_array_equal(with_fill[0], without[0])


@pytest.mark.parametrize("bad", ["index_high", "index_negative", "indptr_decreasing",
                                 "indptr_past_end"])
def test_bad_indices_are_reported_not_read(bad):
  rng = np.random.default_rng(23)
  batch = make_batch(rng, num_heads=16, lengths=[10, 20], pool_rows=32)
  batch.kv_indices = batch.kv_indices.copy()
  batch.kv_indptr = batch.kv_indptr.copy()
  if bad == "index_high":
    batch.kv_indices[13] = 32
    match = r"kv_indices\[13\] = 32 is outside \[0, 32\)"
  elif bad == "index_negative":
    batch.kv_indices[2] = -1
    match = r"kv_indices\[2\] = -1"
  elif bad == "indptr_decreasing":
    batch.kv_indptr[2] = 5
    match = r"kv_indptr\[2\] = 5 < kv_indptr\[1\] = 10"
  else:
    batch.kv_indptr[2] = 31
    match = r"kv_indptr\[2\] = 31 is outside \[0, 30\]"
  with pytest.raises(jax.errors.JaxRuntimeError, match=match):
    run(batch, 2)


def test_empty_batch():
  rng = np.random.default_rng(0)
  batch = make_batch(rng, num_heads=16, lengths=[], pool_rows=8)
  out, lse = run(batch, 2)
  assert out.shape == (0, 16, 512) and lse.shape == (0, 16)


def test_both_empty_row_fixups_agree():
  """The gfx950 path zeroes empty rows with a scatter, the host path with a select: same bits."""
  rng = np.random.default_rng(29)
  batch = make_batch(rng, num_heads=16, lengths=[0, 12, 0, 3], tokens_per_seq=4, pool_rows=32)
  (raw,) = kernel_results(batch, 1)  # NaN in the unwritten rows
  kv_indptr = jnp.asarray(batch.kv_indptr)
  def fixed(method):
    return jax.jit(lambda out, indptr: empty_rows.zero_rows(
        out, empty_rows.empty_tokens(indptr, 4, out.shape[0]), method))(raw, kv_indptr)
  scatter, select = fixed("scatter"), fixed("select")
  scatter = np.asarray(scatter.astype(jnp.float32))
  np.testing.assert_array_equal(scatter, np.asarray(select.astype(jnp.float32)))
  assert np.isfinite(scatter).all() and np.all(scatter[0:4] == 0) and np.all(scatter[8:12] == 0)


def test_a_call_written_before_the_merge_attribute_still_runs():
  """A custom call lowered before merge_in_executor existed (a serialized jax.export, say)
  carries three attributes and expects the kernel's own results: it still gets them."""
  from jax_mla._src import ext  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(41)
  batch = make_batch(rng, num_heads=16, lengths=[40, 0, 100], pool_rows=128, sink=0.25)
  ext.ensure_registered()
  num_tokens, num_seqs = batch.q.shape[0], len(batch.kv_indptr) - 1
  call = jax.ffi.ffi_call(split_kernel.TARGET, split_kernel.split_result_shapes(
      num_tokens, 16, num_seqs, 2))
  seq = np.arange(num_seqs + 1, dtype=np.int32)
  old = jax.jit(lambda *a: call(*a, num_kv_splits=np.int32(2), tokens_per_seq=np.int32(1),
                                fill_unwritten_nan=np.bool_(True)))(
      *batch.args()[:-1], batch.sink_array(), seq, seq * 2)
  for got, want in zip(old, kernel_results(batch, 2)):
    np.testing.assert_array_equal(np.asarray(got), want)
  # The three it always had stay required.
  with pytest.raises(jax.errors.JaxRuntimeError, match=r"\(cpu\): attribute: .*fill_unwritten"):
    jax.block_until_ready(jax.jit(lambda *a: call(
        *a, num_kv_splits=np.int32(2), tokens_per_seq=np.int32(1)))(
            *batch.args()[:-1], batch.sink_array(), seq, seq * 2))


@pytest.mark.parametrize("operand,bad,match", [
    (6, np.zeros(17, np.float32), r"sink \(operand 6\) has dtype f32 dims \[17\]; expected f32 "
                                  r"dims \[16\]"),
    (0, None, r"q \(operand 0\) has dtype s8 .*expected u8"),
    (8, np.arange(4, dtype=np.int32), r"split_indptr\[1\] = 1, expected 2"),
    (7, np.array([0, 1, 2, 9], np.int32), r"qo_indptr\[3\] = 9 is outside \[0, 3\]"),
])
def test_handler_rechecks_operands(operand, bad, match):
  """The C++ handler refuses what the Python side would never send (bind called directly)."""
  rng = np.random.default_rng(31)
  batch = make_batch(rng, num_heads=16, lengths=[3, 4, 5], pool_rows=16)
  seq = np.arange(4, dtype=np.int32)
  operands = list(batch.args()[:-1]) + [batch.sink_array(), seq, seq * 2]
  operands[operand] = batch.q.view(np.int8) if bad is None else bad
  f = jax.jit(lambda *a: split_kernel.split_decode_p.bind(
      *a, num_kv_splits=2, tokens_per_seq=1, backend="host", fill_unwritten_nan=True,
      merge_in_executor=False))
  with pytest.raises(jax.errors.JaxRuntimeError, match=match):
    jax.block_until_ready(f(*operands))


@pytest.mark.parametrize("num_kv_splits", [1, 2])
def test_all_sequences_empty_with_no_indices(num_kv_splits):
  rng = np.random.default_rng(37)
  batch = make_batch(rng, num_heads=16, lengths=[0, 0, 0], pool_rows=4, sink=0.5)
  assert batch.kv_indices.shape == (0,)
  out, lse = run(batch, num_kv_splits)
  assert np.all(out == 0)
  check_against_oracle(batch, out, lse)


# --- the CPU kernels: both families, long and ragged runs, calls at once ---------------------------

@pytest.fixture(params=["default", "fp32"])
def host_kernels(request, monkeypatch):
  """The host core's kernel family (JAX_MLA_HOST_KERNELS, read at each call): the default is
  AVX512-BF16 where the CPU has it."""
  if request.param == "fp32":
    monkeypatch.setenv("JAX_MLA_HOST_KERNELS", "fp32")
  else:
    monkeypatch.delenv("JAX_MLA_HOST_KERNELS", raising=False)
  return request.param


@pytest.mark.parametrize("num_kv_splits", [1, 2, 5, None], ids=lambda s: f"S{s}")
@pytest.mark.parametrize("gqa,msq", [(128, 1), (16, 4), (32, 1)], ids=str)
def test_long_ragged_runs_on_both_kernel_families(host_kernels, gqa, msq, num_kv_splits):
  """Runs across the core's tile boundaries (96 or 48 tokens) and its micro-kernels' token
  groups, with a partial last tile of every size class; rows in blocks of 128 and fewer."""
  rng = np.random.default_rng(gqa + msq + (num_kv_splits or 0))
  batch = make_batch(rng, num_heads=gqa, lengths=[0, 1, 47, 95, 96, 97, 191, 700],
                     tokens_per_seq=msq, pool_rows=1000, sink=rng.standard_normal(gqa) * 2)
  out, lse = run(batch, num_kv_splits)
  check_against_oracle(batch, out, lse)


def test_every_fp8_byte_at_every_scale(host_kernels):
  """One KV entry per sequence and Q zero: each output row is its KV row, dequantized (exact in
  bf16), for every e4m3 byte at every e8m0 scale where the value is a finite float (the bf16
  kernels take a lookup table for scales 2^-117..2^118 and f32 arithmetic outside it). Scale
  byte 0 (2^-127) is left out: a denormal, read as 0 under XLA's flush-to-zero, by both
  families; results that are denormal are 0 or denormal."""
  from support.oracle import dequantize_rows  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(47)
  fp8 = np.arange(256)
  fp8 = fp8[(fp8 & 0x7F) != 0x7F]  # NaN
  rows = []
  for scale_byte in range(1, 255):
    value = dequantize_rows(np.concatenate([np.resize(fp8, 448), np.full(64, scale_byte)])
                            .astype(np.uint8)[None], np.zeros((1, 64), np.float32))[0, :448]
    usable = fp8[np.abs(value[:len(fp8)]) < 2.0**127]  # finite in f32 and bf16
    row = np.zeros(512, np.uint8)
    row[:448] = np.roll(np.resize(usable, 448), scale_byte)
    row[448:462] = scale_byte
    rows.append(row)
  kv = np.stack(rows)
  kv_rope = rng.standard_normal((len(rows), 64)).astype(jnp.bfloat16)
  num = len(rows)
  q = np.zeros((num, 16, 512), np.uint8)
  q[..., 448:462] = 127
  q_rope = np.zeros((num, 16, 64), jnp.bfloat16)
  indptr = np.arange(num + 1, dtype=np.int32)
  indices = np.arange(num, dtype=np.int32)
  sink = np.full(16, -np.inf, np.float32)
  out, _ = jitted(1, 1, False)(q, q_rope, kv, kv_rope, indptr, indices, sink)
  out = np.asarray(out.astype(jnp.float32))
  want = dequantize_rows(kv, kv_rope)
  normal = np.abs(want) >= 2.0**-126  # the bf16 kernels' dot products flush denormals
  for h in range(16):
    np.testing.assert_array_equal(out[:, h][normal], want[normal])
    assert np.all(np.abs(out[:, h][~normal]) < 2.0**-126)


def test_both_kernel_families_agree(monkeypatch):
  rng = np.random.default_rng(41)
  batch = make_batch(rng, num_heads=128, lengths=[300, 5, 0], pool_rows=400, sink=0.25)
  monkeypatch.setenv("JAX_MLA_HOST_KERNELS", "fp32")
  fp32 = run(batch, 3)
  monkeypatch.delenv("JAX_MLA_HOST_KERNELS")
  default = run(batch, 3)
  scale = np.abs(fp32[0]).max()
  np.testing.assert_allclose(default[0], fp32[0], atol=scale * 2.0**-7)
  np.testing.assert_allclose(default[1], fp32[1], atol=1e-4)


def test_calls_at_the_same_time_match_calls_in_turn():
  """Executor calls from several threads at once: one gets the kept helper threads, the others
  start their own; every result is the one a call alone gives (bit for bit)."""
  import concurrent.futures  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(43)
  batches = [make_batch(rng, num_heads=64, lengths=[200, 17, 0, 64], pool_rows=300, sink=0.5)
             for _ in range(4)]
  alone = [run(b, 2) for b in batches]
  for _ in range(3):
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
      together = list(pool.map(lambda b: run(b, 2), batches))
    for (out, lse), (want_out, want_lse) in zip(together, alone):
      np.testing.assert_array_equal(out, want_out)
      np.testing.assert_array_equal(lse, want_lse)
