"""The Pallas kernels with two KV sources in one call (`extra=`: DeepSeek-V4's sliding window
and compressed top-k, each its own pool), a softmax scale other than 1/sqrt(512), Q as the
model holds it (bf16 or f32 values [T, H, 512], q_rope None: read by the kernels as they are,
f32 rounded to bf16), and pools as servers keep them (bf16 or f32 rows [R, 512], kv_rope None,
in either source or both: read the same way; checked against the oracle on their bf16 values).

The expected results come from the float64 oracle on one pool: the two pools concatenated and
the second source's indices offset into the copy, each sequence's two lists joined. That path
shares nothing with the kernels' split of a sequence's blocks between the sources. The Triton
kernel runs in Pallas interpret mode (and compiled on a GPU: marked `gpu`); the Mosaic kernel is
lowered for an H200 here and runs against the same oracle in Mosaic GPU's interpret mode
(test_mosaic.py's modes: its CTAs unpaired) and on an sm90 GPU (marked `gpu`).
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from support.compare import assert_bf16_decode_close
from support.gpu_export import export_for
from support.oracle import dequantize_rows, oracle_attend, oracle_decode, token_keys
from support.rows import make_batch, poison_padding
from jax_mla._src.pallas import backend as pallas_backend
from jax_mla._src.pallas import triton as pd
from test_mosaic import call as mosaic_call, few_splits, with_modes, with_modes_by
from test_mosaic import xla_merges_below_32_splits  # noqa: F401  (autouse)
from test_pallas import MODES  # Pallas interpret mode, and compiled through Triton on a GPU


def unpaired_few_splits(shape):
  """Interpret mode for two sources: unpaired CTAs only. Paired, the interpreted kernel hangs
  now and then: one sequence with 5 entries in A and 70 in B hung in 11 of 28 runs on a 2-core
  machine busy with CI beside it (2026-12-06, jax 0.12.0.1), also with XLA:CPU's Eigen threads
  or its async dispatch off, and ran in 8-13 s otherwise. In a hung run only some warpgroups
  wait on a barrier, each at its first phase with no arrival; the warpgroups that would arrive
  there sit inside their XLA executions, outside any barrier, using no CPU. So the interpreter
  stalls, not the kernel's order of waits (a deadlock of that order leaves every warpgroup at a
  barrier); the same cases pass on the GPU. Where is not found."""
  return shape[0] * shape[1] < 128 and few_splits(shape)


# DeepSeek-V4's own scale is 1/sqrt(512) times a YaRN factor: not a power of two of the default.
SCALE = 0.0713


@dataclasses.dataclass
class TwoSources:
  """A decode batch (source A: batch's pool and lists) and a second source B."""
  batch: object
  kv2: np.ndarray
  kv_rope2: np.ndarray
  kv_indptr2: np.ndarray
  kv_indices2: np.ndarray

  def extra(self):
    return (self.kv2, self.kv_rope2, self.kv_indptr2, self.kv_indices2)

  def kernel_args(self):
    """decode's positional arguments with the sink as f32 [H] (-inf: none)."""
    return (*self.batch.args()[:-1], self.batch.sink_array())

  def one_pool(self):
    """The same problem on one pool: B's rows appended to A's, each sequence's B entries
    (offset into the appended rows) after its A entries."""
    b = self.batch
    offset = b.kv.shape[0]
    lists = []
    for s in range(len(b.kv_indptr) - 1):
      lists.append(b.kv_indices[b.kv_indptr[s]:b.kv_indptr[s + 1]])
      lists.append(self.kv_indices2[self.kv_indptr2[s]:self.kv_indptr2[s + 1]] + offset)
    indices = np.concatenate(lists).astype(np.int32)
    lengths = np.diff(b.kv_indptr) + np.diff(self.kv_indptr2)
    return (b.q, b.q_rope, np.concatenate([b.kv, self.kv2]),
            np.concatenate([b.kv_rope, self.kv_rope2]),
            np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32), indices, b.sink)


def make_two_sources(rng, *, num_heads, lengths_a, lengths_b, tokens_per_seq=1, pool_a=300,
                     pool_b=200, sink=None, poison=True):
  batch = make_batch(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq,
                     lengths=lengths_a, pool_rows=pool_a, sink=sink, extra_indices=5)
  second = make_batch(rng, num_heads=1, lengths=lengths_b, pool_rows=pool_b, extra_indices=3)
  sources = TwoSources(batch, second.kv, second.kv_rope, second.kv_indptr, second.kv_indices)
  if poison:  # padding bytes 462..511 must never be read: e8m0 NaN there would show
    batch.q = poison_padding(batch.q, "ff")
    batch.kv = poison_padding(batch.kv, "ff")
    sources.kv2 = poison_padding(sources.kv2, "random", rng)
  return sources


def oracle(sources, softmax_scale=None, q=None):
  """oracle_decode on the one-pool problem; another softmax scale by scaled_oracle. q: float Q
  (bf16 or f32 [T, H, 512]) in place of the batch's packed Q, as the kernels compute with it
  (computed_query)."""
  args = sources.one_pool()
  if q is not None:
    scale = 1 / math.sqrt(512) if softmax_scale is None else softmax_scale
    return values_oracle(computed_query(q), *args[2:], sources.batch.tokens_per_seq, scale)
  if softmax_scale is None:
    return oracle_decode(*args, sources.batch.tokens_per_seq)
  return scaled_oracle(*args, sources.batch.tokens_per_seq, softmax_scale)


def scaled_oracle(q_packed, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, tokens_per_seq,
                  softmax_scale):
  """float64 decode with scores q.k * softmax_scale, from the oracle's bit-level row decoder
  (oracle_decode fixes the scale at 1/sqrt(512); test_scaled_oracle_is_the_oracle holds this
  to it there). Sinks of +-inf and empty lists as oracle_decode."""
  return values_oracle(dequantize_rows(q_packed, q_rope), kv, kv_rope, kv_indptr, kv_indices,
                       sink, tokens_per_seq, softmax_scale)


def values_oracle(q, kv, kv_rope, kv_indptr, kv_indices, sink, tokens_per_seq, softmax_scale):
  """scaled_oracle with Q given as float64 values [T, H, 512]; a NaN in a query row makes that
  row's out and lse NaN (whatever the sink)."""
  keys = token_keys(dequantize_rows(kv, kv_rope), kv_indptr, kv_indices, q.shape[0],
                    tokens_per_seq)
  out, lse = oracle_attend(q, keys, sink, softmax_scale)
  nan_rows = np.isnan(q).any(axis=-1)
  out[nan_rows], lse[nan_rows] = np.nan, np.nan
  return out, lse


def as_f32(x):
  return np.asarray(jnp.asarray(x, jnp.float32))


@functools.lru_cache(maxsize=None)
def triton_decoder(mode, tokens_per_seq, num_kv_splits, softmax_scale, two_sources=True):
  def decode(*args):
    extra = args[7:] if two_sources else None
    return pd.pallas_decode(*args[:7], tokens_per_seq=tokens_per_seq,
                            num_kv_splits=num_kv_splits, softmax_scale=softmax_scale,
                            extra=extra, interpret=(mode == "interpret"))
  return jax.jit(decode)


def run_triton(mode, sources, num_kv_splits=None, softmax_scale=None):
  out, lse = triton_decoder(mode, sources.batch.tokens_per_seq, num_kv_splits, softmax_scale)(
      *sources.kernel_args(), *sources.extra())
  return as_f32(out), np.asarray(lse)


def check(out, lse, want):
  """Finite exactly where the oracle is, then assert_bf16_decode_close."""
  assert np.array_equal(np.isfinite(out), np.isfinite(want[0])), "non-finite pattern of out"
  assert np.array_equal(np.isfinite(lse), np.isfinite(want[1])), "non-finite pattern of lse"
  assert_bf16_decode_close(out, lse, *want)


# Sequence 1 is empty in A, 2 in B, 3 in both; 0 and 4 span several KV blocks of one source
# and fewer than a block of the other.
LENGTHS_A = [5, 0, 130, 0, 64]
LENGTHS_B = [70, 3, 0, 0, 200]


def test_scaled_oracle_is_the_oracle():
  sources = make_two_sources(np.random.default_rng(0), num_heads=16, lengths_a=LENGTHS_A,
                             lengths_b=LENGTHS_B, sink=0.3)
  args = sources.one_pool()
  want_out, want_lse = oracle_decode(*args, 1)
  out, lse = scaled_oracle(*args, 1, 1 / math.sqrt(512))
  np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-15)
  np.testing.assert_allclose(lse, want_lse, rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_heads,tokens_per_seq", [(16, 1), (16, 4), (128, 1)])
@pytest.mark.parametrize("splits", [1, 3, None], ids=["one_split", "three", "planned"])
def test_two_sources_match_the_oracle(mode, num_heads, tokens_per_seq, splits):
  sources = make_two_sources(np.random.default_rng(num_heads + tokens_per_seq),
                             num_heads=num_heads, tokens_per_seq=tokens_per_seq,
                             lengths_a=LENGTHS_A, lengths_b=LENGTHS_B, sink=0.3)
  out, lse = run_triton(mode, sources, num_kv_splits=splits)
  check(out, lse, oracle(sources))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sink", [None, -np.inf, -2.0, 60.0, np.inf])
@pytest.mark.parametrize("softmax_scale", [None, SCALE])
def test_two_sources_sinks_and_scales(mode, sink, softmax_scale):
  sources = make_two_sources(np.random.default_rng(3), num_heads=16, lengths_a=LENGTHS_A,
                             lengths_b=LENGTHS_B, sink=sink)
  out, lse = run_triton(mode, sources, num_kv_splits=2, softmax_scale=softmax_scale)
  check(out, lse, oracle(sources, softmax_scale))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("splits", [1, 2])
def test_softmax_scale_on_one_source(mode, splits):
  batch = make_batch(np.random.default_rng(4), num_heads=64, lengths=[5, 0, 150], sink=0.3,
                     extra_indices=5)
  batch.kv = poison_padding(batch.kv, "ff")
  decode = triton_decoder(mode, 1, splits, SCALE, two_sources=False)
  out, lse = decode(*batch.args()[:-1], batch.sink_array())
  check(as_f32(out), np.asarray(lse), scaled_oracle(*batch.args(), 1, SCALE))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("source", ["a", "b"])
def test_a_nan_in_a_used_row_stays_in_its_sequence(mode, source):
  sources = make_two_sources(np.random.default_rng(6), num_heads=16, lengths_a=LENGTHS_A,
                             lengths_b=LENGTHS_B, sink=0.3, poison=False)
  pool, indices, indptr = ((sources.batch.kv, sources.batch.kv_indices, sources.batch.kv_indptr)
                           if source == "a" else
                           (sources.kv2, sources.kv_indices2, sources.kv_indptr2))
  pool[indices[indptr[4]], 448:450] = 0xFF  # the e8m0 scale of tile 0 of a row of sequence 4
  out, lse = run_triton(mode, sources, num_kv_splits=3)
  assert np.isnan(out[4]).all() and np.isnan(lse[4]).all()
  others = [0, 1, 2, 3]
  want_out, want_lse = oracle(sources)
  check(out[others], lse[others], (want_out[others], want_lse[others]))


@pytest.mark.parametrize("forms", [("packed", "packed"), ("bfloat16", "float32")],
                         ids=["packed", "bf16-f32"])
def test_one_executable_serves_every_set_of_lengths(forms):
  traces = []

  def decode(*args):
    traces.append(1)
    return pd.pallas_decode(*args[:7], tokens_per_seq=1, num_kv_splits=None, extra=args[7:],
                            interpret=True)

  jitted = jax.jit(decode)
  # The same totals per source: the same index-list shapes.
  problems = [float_pool_sources(48 + seed, forms, lengths_a=lengths_a, lengths_b=lengths_b,
                                 sink=0.0)[0]
              for seed, (lengths_a, lengths_b) in enumerate((([10, 20, 30], [60, 0, 40]),
                                                             ([0, 0, 60], [0, 100, 0]),
                                                             ([59, 1, 0], [1, 1, 98])))]
  # The first call in a process imports Pallas, which defines config options: the next call
  # re-traces once (README). Two warm-up calls, then no trace at all.
  for _ in range(2):
    jitted(*problems[0].kernel_args(), *problems[0].extra())
  traces.clear()
  for sources in problems:
    out, lse = jitted(*sources.kernel_args(), *sources.extra())
    check(as_f32(out), np.asarray(lse), pools_oracle(sources))
  assert not traces


def test_the_backend_entry_takes_both_keywords(monkeypatch):
  """pallas.backend.decode, the registry's entry, with the Triton kernel in interpret mode."""
  monkeypatch.setattr(pallas_backend, "device_kernel", lambda: ("triton", "interpret mode"))
  monkeypatch.setattr(pallas_backend, "_interpret", lambda: True)
  sources = make_two_sources(np.random.default_rng(8), num_heads=64, lengths_a=LENGTHS_A,
                             lengths_b=LENGTHS_B, sink=0.2)
  out, lse = jax.jit(lambda *a: pallas_backend.decode(
      *a[:7], tokens_per_seq=1, num_kv_splits=None, return_lse=True, softmax_scale=SCALE,
      extra=a[7:]))(*sources.kernel_args(), *sources.extra())
  check(as_f32(out), np.asarray(lse), oracle(sources, SCALE))


def abstract(arrays):
  return [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in arrays]


@pytest.mark.parametrize("platform", ["rocm", "cuda"])
def test_triton_lowers_two_sources_as_one_kernel(platform):
  """Both pools are operands of the one Triton call: no copy of either, no second kernel."""
  sources = make_two_sources(np.random.default_rng(9), num_heads=128, lengths_a=[5, 7, 0],
                             lengths_b=[9, 0, 0], sink=0.1)
  decode = lambda *a: pd.pallas_decode(*a[:7], tokens_per_seq=1, num_kv_splits=2,
                                       softmax_scale=SCALE, extra=a[7:])
  text = export_for(decode, platform, *abstract([*sources.kernel_args(), *sources.extra()]),
                    custom_calls=["__gpu$xla.gpu.triton"]).mlir_module()
  calls = [line for line in text.splitlines() if "__gpu$xla.gpu.triton" in line]
  assert len(calls) == 1, calls
  operands = calls[0].split("(", 1)[1].split(")", 1)[0].split(", ")
  # Both pools (kv, kv_rope: arguments 2, 3; kv2, kv_rope2: 7, 8) go in as they are.
  assert {"%arg2", "%arg3", "%arg7", "%arg8"} <= set(operands), operands
  assert "grid_x = 3 : i32, grid_y = 2 : i32, grid_z = 2 : i32" in calls[0]


# The Mosaic kernel: (heads, tokens, lengths of A, of B, splits). 128 heads pair their CTAs,
# 64 and 16 x 4 do not; 40 splits take the merge kernel, 3 XLA's merge, 1 none.
MOSAIC_SHAPES = [(16, 4, LENGTHS_A, LENGTHS_B, 1), (64, 1, [300, 2], [0, 130], 3),
                 (128, 1, LENGTHS_A, LENGTHS_B, None), (128, 1, [300, 0, 2500], [0, 9, 512], 40)]


def mosaic_decoder(tokens_per_seq, num_kv_splits, softmax_scale):
  from jax_mla._src.pallas.mosaic import decode as md  # pylint: disable=import-outside-toplevel
  return lambda *a: md.mosaic_decode(*a[:7], tokens_per_seq=tokens_per_seq,
                                     num_kv_splits_=num_kv_splits, softmax_scale=softmax_scale,
                                     extra=a[7:])


@pytest.mark.parametrize("num_heads,tokens_per_seq,lengths_a,lengths_b,splits", MOSAIC_SHAPES)
def test_mosaic_lowers_two_sources_for_cuda(num_heads, tokens_per_seq, lengths_a, lengths_b,
                                            splits):
  sources = make_two_sources(np.random.default_rng(10), num_heads=num_heads,
                             tokens_per_seq=tokens_per_seq, lengths_a=lengths_a,
                             lengths_b=lengths_b, sink=0.3)
  text = export_for(mosaic_decoder(tokens_per_seq, splits, SCALE), "cuda",
                    *abstract([*sources.kernel_args(), *sources.extra()]),
                    custom_calls=["mosaic_gpu_v2", "__gpu$xla.gpu.triton"]).mlir_module()
  calls = [line for line in text.splitlines() if "mosaic_gpu_v2" in line]
  assert len(calls) == 1, calls
  operands = calls[0].split("(", 1)[1].split(")", 1)[0].split(", ")
  assert {"%arg2", "%arg3", "%arg7", "%arg8"} <= set(operands), operands  # both pools as given
  assert ("jax_mla_merge_partials" in text) == (splits == 40)


@pytest.mark.parametrize("softmax_scale", [None, SCALE])
@pytest.mark.parametrize("mode,num_heads,tokens_per_seq,lengths_a,lengths_b,splits",
                         with_modes(MOSAIC_SHAPES, unpaired_few_splits))
def test_mosaic_two_sources_match_the_oracle(mode, num_heads, tokens_per_seq, lengths_a,
                                             lengths_b, splits, softmax_scale, monkeypatch):
  sources = make_two_sources(np.random.default_rng(num_heads + tokens_per_seq),
                             num_heads=num_heads, tokens_per_seq=tokens_per_seq,
                             lengths_a=lengths_a, lengths_b=lengths_b, pool_a=4096,
                             pool_b=2048, sink=0.3)
  out, lse = mosaic_call(mode, monkeypatch, mosaic_decoder(tokens_per_seq, splits, softmax_scale),
                        *sources.kernel_args(), *sources.extra())
  check(as_f32(out), np.asarray(lse), oracle(sources, softmax_scale))


@pytest.mark.parametrize("sink", [None, np.inf])
@pytest.mark.parametrize("mode,num_heads,tokens_per_seq",
                         with_modes([(64, 1), (128, 1)], unpaired_few_splits))
def test_mosaic_two_sources_edge_cases(mode, num_heads, tokens_per_seq, sink, monkeypatch):
  """A NaN row in source B (its sequence only), +inf sinks, an empty second list."""
  rng = np.random.default_rng(11)
  sources = make_two_sources(rng, num_heads=num_heads, lengths_a=LENGTHS_A,
                             lengths_b=LENGTHS_B, sink=sink)
  if sink is None:
    sources.kv2[sources.kv_indices2[sources.kv_indptr2[4]], 448:450] = 0xFF
  decode = functools.partial(mosaic_call, mode, monkeypatch,
                             mosaic_decoder(tokens_per_seq, 2, None))
  out, lse = decode(*sources.kernel_args(), *sources.extra())
  out, lse = as_f32(out), np.asarray(lse)
  if sink is None:
    assert np.isnan(out[4]).all() and np.isnan(lse[4]).all()
  else:
    assert (out == 0).all() and (lse == np.inf).all()
  want_out, want_lse = oracle(sources)
  check(out[:4], lse[:4], (want_out[:4], want_lse[:4]))

  empty = make_two_sources(rng, num_heads=num_heads, lengths_a=[7, 90], lengths_b=[0, 0],
                           sink=0.5)
  empty.kv_indices2 = empty.kv_indices2[:0]
  out, lse = decode(*empty.kernel_args(), *empty.extra())
  check(as_f32(out), np.asarray(lse), oracle(empty))


# --- Float Q: bf16 or f32 values [T, H, 512] (RoPE in dims 448..511), q_rope None ----------------
# The kernels read them as they are, f32 rounded to bf16 (nearest even), the tensor cores'
# operand type: no fp8 rounding, no XLA pass before the kernel.

FLOAT_DTYPES = ["bfloat16", "float32"]


def float_query(batch, rng, dtype):
  """Q as a model holds it: the batch's packed Q's values moved off the fp8 grid (each times
  1 + 0.2 n, n standard normal: scores stay O(1)), as `dtype` [T, H, 512]."""
  values = dequantize_rows(batch.q, batch.q_rope)
  values = values * (1 + 0.2 * rng.standard_normal(values.shape))
  return np.array(jnp.asarray(values, jnp.dtype(dtype)))  # a writable copy


def computed_query(q):
  """The query values the kernels compute with: bf16 as given, f32 rounded to bf16."""
  return np.asarray(jnp.asarray(jnp.asarray(q).astype(jnp.bfloat16), jnp.float32), np.float64)


def float_args(sources, q):
  """decode's positional arguments (sink f32 [H]) with float Q and q_rope None."""
  return (q, None, *sources.kernel_args()[2:])


def run_triton_float(mode, sources, q, num_kv_splits=None, softmax_scale=None, two=True):
  decode = triton_decoder(mode, sources.batch.tokens_per_seq, num_kv_splits, softmax_scale,
                          two_sources=two)
  out, lse = decode(*float_args(sources, q), *(sources.extra() if two else ()))
  return as_f32(out), np.asarray(lse)


def assert_not_within_packing(sources, q, want, softmax_scale=None):
  """The check has the power to tell: Q packed to fp8 (what the API did before float Q was
  native) gives results outside the tolerance of the float-Q oracle."""
  packed = jax.tree.map(np.asarray, jax_mla_pack_rows(jnp.asarray(q, jnp.float32)))
  packed_sources = dataclasses.replace(sources, batch=dataclasses.replace(
      sources.batch, q=packed[0], q_rope=packed[1]))
  with pytest.raises(AssertionError):
    assert_bf16_decode_close(*oracle(packed_sources, softmax_scale), *want)


def jax_mla_pack_rows(x):
  from jax_mla import pack_rows  # pylint: disable=import-outside-toplevel
  return pack_rows(x)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("num_heads,tokens_per_seq", [(16, 1), (16, 4), (128, 1)])
@pytest.mark.parametrize("splits", [1, 3])
def test_float_q_matches_the_oracle(mode, dtype, num_heads, tokens_per_seq, splits):
  """Two sources (sequences empty in either and in both), a sink per head, poisoned padding of
  the pools: the oracle on the Q values themselves (f32: rounded to bf16)."""
  rng = np.random.default_rng(20 + num_heads + tokens_per_seq)
  sources = make_two_sources(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq,
                             lengths_a=LENGTHS_A, lengths_b=LENGTHS_B,
                             sink=rng.normal(size=num_heads).astype(np.float32))
  q = float_query(sources.batch, rng, dtype)
  out, lse = run_triton_float(mode, sources, q, num_kv_splits=splits)
  want = oracle(sources, q=q)
  check(out, lse, want)
  if mode == "interpret" and splits == 1:
    assert_not_within_packing(sources, q, want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sink", [None, -np.inf, -2.0, 60.0, np.inf])
@pytest.mark.parametrize("softmax_scale", [None, SCALE])
def test_float_q_sinks_and_scales(mode, sink, softmax_scale):
  rng = np.random.default_rng(21)
  sources = make_two_sources(rng, num_heads=16, lengths_a=LENGTHS_A, lengths_b=LENGTHS_B,
                             sink=sink)
  q = float_query(sources.batch, rng, "bfloat16")
  out, lse = run_triton_float(mode, sources, q, num_kv_splits=2, softmax_scale=softmax_scale)
  check(out, lse, oracle(sources, softmax_scale, q=q))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("splits", [1, 2])
def test_float_q_on_one_source_with_a_scale(mode, dtype, splits):
  rng = np.random.default_rng(22)
  batch = make_batch(rng, num_heads=64, lengths=[5, 0, 150], sink=0.3, extra_indices=5)
  batch.kv = poison_padding(batch.kv, "ff")
  q = float_query(batch, rng, dtype)
  decode = triton_decoder(mode, 1, splits, SCALE, two_sources=False)
  out, lse = decode(q, None, *batch.args()[2:-1], batch.sink_array())
  check(as_f32(out), np.asarray(lse),
        values_oracle(computed_query(q), *batch.args()[2:], 1, SCALE))


@pytest.mark.parametrize("mode", MODES)
def test_f32_q_computes_as_its_bf16_rounding(mode):
  """f32 Q gives bit for bit the results of the same Q rounded to bf16 (nearest even) first."""
  rng = np.random.default_rng(23)
  sources = make_two_sources(rng, num_heads=16, tokens_per_seq=4, lengths_a=LENGTHS_A,
                             lengths_b=LENGTHS_B, sink=0.3)
  q = float_query(sources.batch, rng, "float32")
  q_bf16 = np.asarray(jnp.asarray(q).astype(jnp.bfloat16))
  assert not np.array_equal(q_bf16.astype(np.float32), q)  # the rounding does something
  out, lse = run_triton_float(mode, sources, q, num_kv_splits=3)
  out16, lse16 = run_triton_float(mode, sources, q_bf16, num_kv_splits=3)
  np.testing.assert_array_equal(out, out16)
  np.testing.assert_array_equal(lse, lse16)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_a_nan_in_float_q_stays_in_its_row(mode, dtype):
  """A NaN in one (token, head)'s Q makes that row's out and lse NaN and no other."""
  rng = np.random.default_rng(24)
  sources = make_two_sources(rng, num_heads=16, lengths_a=LENGTHS_A, lengths_b=LENGTHS_B,
                             sink=0.3)
  q = float_query(sources.batch, rng, dtype)
  q[4, 5, 300] = np.nan
  out, lse = run_triton_float(mode, sources, q, num_kv_splits=2)
  assert np.isnan(out[4, 5]).all() and np.isnan(lse[4, 5])
  check(out, lse, oracle(sources, q=q))


def test_float_q_backend_entry(monkeypatch):
  """pallas.backend.decode, the registry's entry, with float Q (q_rope None) and both keywords;
  the Triton kernel in interpret mode."""
  monkeypatch.setattr(pallas_backend, "device_kernel", lambda: ("triton", "interpret mode"))
  monkeypatch.setattr(pallas_backend, "_interpret", lambda: True)
  rng = np.random.default_rng(25)
  sources = make_two_sources(rng, num_heads=64, lengths_a=LENGTHS_A, lengths_b=LENGTHS_B,
                             sink=0.2)
  q = float_query(sources.batch, rng, "bfloat16")
  out, lse = jax.jit(lambda *a: pallas_backend.decode(
      *a[:7], tokens_per_seq=1, num_kv_splits=None, return_lse=True, softmax_scale=SCALE,
      extra=a[7:]))(*float_args(sources, q), *sources.extra())
  check(as_f32(out), np.asarray(lse), oracle(sources, SCALE, q=q))


def float_abstract(sources, dtype):
  """Abstract decode arguments with float Q of `dtype` (q_rope None) and the second source."""
  q_shape = sources.batch.q.shape
  return [jax.ShapeDtypeStruct(q_shape, jnp.dtype(dtype)), None,
          *abstract([*sources.kernel_args()[2:], *sources.extra()])]


def assert_q_goes_in_as_given(text, custom_call, dtype, num_rows):
  """One kernel call; Q reaches it as the argument reshaped (no conversion, no fp8 packing)."""
  lines = text.splitlines()
  calls = [line for line in lines if custom_call in line]
  assert len(calls) == 1, calls
  # The XLA ops around the kernel call (the call's own line holds the kernel's serialized IR).
  outside = "\n".join(line.split(" loc(")[0] for line in lines
                      if custom_call not in line and not line.startswith("#loc"))
  assert "f8E4M3" not in outside, "Q was packed before the kernel"
  assert "stablehlo.convert %arg0" not in outside, "Q was converted before the kernel"
  # And the call takes Q's values (packed Q would be uint8 rows).
  element = {"bfloat16": "bf16", "float32": "f32"}[dtype]
  assert f"{num_rows}x512x{element}>" in calls[0], calls[0][:300]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("platform", ["rocm", "cuda"])
def test_triton_lowers_float_q_into_the_kernel(platform, dtype):
  sources = make_two_sources(np.random.default_rng(26), num_heads=128, lengths_a=[5, 7, 0],
                             lengths_b=[9, 0, 0], sink=0.1)
  decode = lambda q, q_rope, *a: pd.pallas_decode(q, q_rope, *a[:5], tokens_per_seq=1,
                                                  num_kv_splits=2, softmax_scale=SCALE,
                                                  extra=a[5:])
  text = export_for(decode, platform, *float_abstract(sources, dtype),
                    custom_calls=["__gpu$xla.gpu.triton"]).mlir_module()
  assert_q_goes_in_as_given(text, "__gpu$xla.gpu.triton", dtype, 128)


def mosaic_float_decoder(tokens_per_seq, num_kv_splits, softmax_scale):
  from jax_mla._src.pallas.mosaic import decode as md  # pylint: disable=import-outside-toplevel
  return lambda q, q_rope, *a: md.mosaic_decode(q, q_rope, *a[:5], tokens_per_seq=tokens_per_seq,
                                                num_kv_splits_=num_kv_splits,
                                                softmax_scale=softmax_scale, extra=a[5:])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("num_heads,tokens_per_seq,lengths_a,lengths_b,splits", MOSAIC_SHAPES)
def test_mosaic_lowers_float_q_for_cuda(num_heads, tokens_per_seq, lengths_a, lengths_b, splits,
                                        dtype):
  sources = make_two_sources(np.random.default_rng(27), num_heads=num_heads,
                             tokens_per_seq=tokens_per_seq, lengths_a=lengths_a,
                             lengths_b=lengths_b, sink=0.3)
  text = export_for(mosaic_float_decoder(tokens_per_seq, splits, SCALE), "cuda",
                    *float_abstract(sources, dtype),
                    custom_calls=["mosaic_gpu_v2", "__gpu$xla.gpu.triton"]).mlir_module()
  num_rows = sources.batch.q.shape[0] * num_heads  # the kernel reads Q as rows [T * H, 512]
  assert_q_goes_in_as_given(text, "mosaic_gpu_v2", dtype, num_rows)
  assert ("jax_mla_merge_partials" in text) == (splits == 40)


def test_mosaic_float_q_copy_rejects_other_dtypes():
  from jax_mla._src.pallas.mosaic import gather  # pylint: disable=import-outside-toplevel
  ref = jax.ShapeDtypeStruct((64, 512), jnp.float16)
  with pytest.raises(ValueError, match="bf16 or f32"):
    gather.copy_consecutive(ref, 0, 64, None)


@pytest.mark.parametrize(
    "mode,num_heads,tokens_per_seq,lengths_a,lengths_b,splits,dtype,softmax_scale",
    with_modes_by(MOSAIC_SHAPES, [(d, s) for d in FLOAT_DTYPES for s in (None, SCALE)],
                  lambda shape, value: unpaired_few_splits(shape) and (
                      value[0] == "bfloat16" or (shape == MOSAIC_SHAPES[0] and value[1] is None))))
def test_mosaic_float_q_matches_the_oracle(mode, num_heads, tokens_per_seq, lengths_a, lengths_b,
                                           splits, dtype, softmax_scale, monkeypatch):
  rng = np.random.default_rng(num_heads + tokens_per_seq)
  sources = make_two_sources(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq,
                             lengths_a=lengths_a, lengths_b=lengths_b, pool_a=4096,
                             pool_b=2048, sink=rng.normal(size=num_heads).astype(np.float32))
  q = float_query(sources.batch, rng, dtype)
  out, lse = mosaic_call(mode, monkeypatch,
                         mosaic_float_decoder(tokens_per_seq, splits, softmax_scale),
                         *float_args(sources, q), *sources.extra())
  check(as_f32(out), np.asarray(lse), oracle(sources, softmax_scale, q=q))


# Interpret mode: 16 x 4 (each case is about ten decodes; paired: unpaired_few_splits).
@pytest.mark.parametrize("mode,num_heads,tokens_per_seq",
                         with_modes([(16, 4), (64, 1), (128, 1)], lambda shape: shape[0] == 16))
def test_mosaic_float_q_edge_cases(mode, num_heads, tokens_per_seq, monkeypatch):
  """f32 Q bit for bit as its bf16 rounding; a NaN in one (token, head) of Q stays in that
  row; +inf and no sinks; the one-source kernel (no extra) with float Q."""
  rng = np.random.default_rng(28)
  sources = make_two_sources(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq,
                             lengths_a=LENGTHS_A, lengths_b=LENGTHS_B, sink=0.3)
  q = float_query(sources.batch, rng, "float32")
  decode = functools.partial(mosaic_call, mode, monkeypatch,
                             mosaic_float_decoder(tokens_per_seq, 2, None))
  out, lse = decode(*float_args(sources, q), *sources.extra())
  out16, lse16 = decode(*float_args(sources, np.asarray(jnp.asarray(q).astype(jnp.bfloat16))),
                        *sources.extra())
  np.testing.assert_array_equal(as_f32(out), as_f32(out16))
  np.testing.assert_array_equal(np.asarray(lse), np.asarray(lse16))
  check(as_f32(out), np.asarray(lse), oracle(sources, q=q))

  nan_q = q.copy()
  nan_q[4 * tokens_per_seq, 5, 300] = np.nan
  out, lse = decode(*float_args(sources, nan_q), *sources.extra())
  out, lse = as_f32(out), np.asarray(lse)
  assert np.isnan(out[4 * tokens_per_seq, 5]).all() and np.isnan(lse[4 * tokens_per_seq, 5])
  check(out, lse, oracle(sources, q=nan_q))

  for sink in (None, np.inf):
    sinks = make_two_sources(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq,
                             lengths_a=LENGTHS_A, lengths_b=LENGTHS_B, sink=sink)
    out, lse = decode(*float_args(sinks, q), *sinks.extra())
    check(as_f32(out), np.asarray(lse), oracle(sinks, q=q))

  from jax_mla._src.pallas.mosaic import decode as md  # pylint: disable=import-outside-toplevel
  batch = sources.batch
  one = functools.partial(md.mosaic_decode, tokens_per_seq=tokens_per_seq, num_kv_splits_=1,
                          softmax_scale=SCALE)
  out, lse = mosaic_call(mode, monkeypatch, one, q, None, *batch.args()[2:-1],
                         batch.sink_array())
  check(as_f32(out), np.asarray(lse),
        values_oracle(computed_query(q), *batch.args()[2:], tokens_per_seq, SCALE))


# --- Float pools: bf16 or f32 rows [R, 512] (RoPE in dims 448..511), kv_rope None ---------------
# DeepSeek-V4 servers keep the sliding-window cache in bf16. The kernels read a float pool's
# listed rows as they are, f32 rounded to bf16 (nearest even): no XLA gather and packing first.

# (source A's form, source B's form): "packed" or a float dtype.
POOL_FORMS = [("bfloat16", "packed"), ("float32", "packed"), ("packed", "bfloat16"),
              ("packed", "float32"), ("bfloat16", "bfloat16"), ("float32", "bfloat16")]
POOL_IDS = [f"{a}-{b}" for a, b in POOL_FORMS]
PADDING_ROWS = 6  # rows appended to a float pool, never listed: NaN and infinities


def float_pool(rng, kv, kv_rope, indptr, indices, dtype):
  """A float pool (`dtype` [R + PADDING_ROWS, 512]) from a packed one: its values moved off the
  fp8 grid (each times 1 + 0.2 n); every row no listed entry names is NaN, the padding rows NaN
  and +-inf, and the entries past the last list name them (never read). Returns (kv, indices)."""
  values = dequantize_rows(kv, kv_rope)
  values = values * (1 + 0.2 * rng.standard_normal(values.shape))
  pad = np.full((PADDING_ROWS, values.shape[1]), np.nan)
  pad[1::3], pad[2::3] = np.inf, -np.inf
  listed = np.zeros(len(values), bool)
  listed[indices[:indptr[-1]]] = True
  values[~listed] = np.nan
  pool = np.concatenate([values, pad])
  unlisted = np.concatenate([np.flatnonzero(~listed), len(values) + np.arange(PADDING_ROWS)])
  indices = indices.copy()
  indices[indptr[-1]:] = rng.choice(unlisted, size=len(indices) - indptr[-1])
  return np.array(jnp.asarray(pool, jnp.dtype(dtype))), indices


def row_only_in(indptr, indices, seq):
  """A pool row that list `seq` names and no other list does."""
  others = np.concatenate([indices[:indptr[seq]], indices[indptr[seq + 1]:indptr[-1]]])
  return next(r for r in indices[indptr[seq]:indptr[seq + 1]] if r not in others)


def with_float_pools(sources, rng, forms):
  """`sources` with each pool in its form of `forms` (A's, B's): "packed" stays, a dtype
  becomes float_pool's."""
  b = sources.batch
  if forms[0] != "packed":
    b.kv, b.kv_indices = float_pool(rng, b.kv, b.kv_rope, b.kv_indptr, b.kv_indices, forms[0])
    b.kv_rope = None
  if forms[1] != "packed":
    sources.kv2, sources.kv_indices2 = float_pool(rng, sources.kv2, sources.kv_rope2,
                                                  sources.kv_indptr2, sources.kv_indices2,
                                                  forms[1])
    sources.kv_rope2 = None
  return sources


def pool_values(kv, kv_rope):
  """float64 [R, 512]: what the kernels compute with: packed rows dequantized, float rows
  rounded to bf16 (bf16 as they are)."""
  if kv_rope is not None:
    return dequantize_rows(kv, kv_rope)
  return np.asarray(jnp.asarray(jnp.asarray(kv).astype(jnp.bfloat16), jnp.float32), np.float64)


def pools_oracle(sources, softmax_scale=None, q=None):
  """The float64 oracle over both sources, from their values (pool_values): per query token
  its A entries' keys, then its B entries'. q: float Q, as `oracle`'s."""
  b = sources.batch
  num_tokens = b.q.shape[0]
  queries = dequantize_rows(b.q, b.q_rope) if q is None else computed_query(q)
  keys_a = token_keys(pool_values(b.kv, b.kv_rope), b.kv_indptr, b.kv_indices, num_tokens,
                      b.tokens_per_seq)
  keys_b = token_keys(pool_values(sources.kv2, sources.kv_rope2), sources.kv_indptr2,
                      sources.kv_indices2, num_tokens, b.tokens_per_seq)
  keys = [np.concatenate([a, k]) for a, k in zip(keys_a, keys_b)]
  scale = 1 / math.sqrt(512) if softmax_scale is None else softmax_scale
  out, lse = oracle_attend(queries, keys, b.sink, scale)
  nan_rows = np.isnan(queries).any(axis=-1)
  out[nan_rows], lse[nan_rows] = np.nan, np.nan
  return out, lse


def float_pool_sources(seed, forms, *, num_heads=16, tokens_per_seq=1, lengths_a=LENGTHS_A,
                       lengths_b=LENGTHS_B, sink=0.3, **kwargs):
  rng = np.random.default_rng(seed)
  sources = make_two_sources(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq,
                             lengths_a=lengths_a, lengths_b=lengths_b, sink=sink, **kwargs)
  return with_float_pools(sources, rng, forms), rng


def test_the_float_pool_oracle_is_the_oracle_on_packed_pools():
  """pools_oracle on two packed pools is oracle's one-pool path."""
  sources, _ = float_pool_sources(30, ("packed", "packed"), sink=0.3)
  want = oracle(sources)
  got = pools_oracle(sources)
  np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-15)
  np.testing.assert_allclose(got[1], want[1], rtol=1e-12)


def test_float_pools_poison_every_unlisted_row():
  """The test data can tell: every pool row the lists do not name is NaN or infinite."""
  sources, _ = float_pool_sources(31, ("bfloat16", "float32"))
  for kv, indptr, indices in ((sources.batch.kv, sources.batch.kv_indptr,
                               sources.batch.kv_indices),
                              (sources.kv2, sources.kv_indptr2, sources.kv_indices2)):
    values = np.asarray(jnp.asarray(kv, jnp.float32))
    listed = np.zeros(len(values), bool)
    listed[indices[:indptr[-1]]] = True
    assert np.isfinite(values[listed]).all()
    assert (~np.isfinite(values[~listed])).all()
    assert set(indices[indptr[-1]:]) <= set(np.flatnonzero(~listed))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("forms", POOL_FORMS, ids=POOL_IDS)
@pytest.mark.parametrize("num_heads,tokens_per_seq", [(16, 4), (128, 1)])
@pytest.mark.parametrize("splits", [1, 3])
def test_float_pools_match_the_oracle(mode, forms, num_heads, tokens_per_seq, splits):
  """Float pools in A, in B, in both (sequences empty in either and in both; unlisted rows
  NaN/inf): the oracle on the pools' bf16 values."""
  sources, _ = float_pool_sources(40 + num_heads + tokens_per_seq, forms, num_heads=num_heads,
                                  tokens_per_seq=tokens_per_seq,
                                  sink=np.linspace(-1, 1, num_heads).astype(np.float32))
  out, lse = run_triton(mode, sources, num_kv_splits=splits)
  check(out, lse, pools_oracle(sources))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sink", [None, -2.0, np.inf])
@pytest.mark.parametrize("softmax_scale", [None, SCALE])
def test_float_pools_sinks_and_scales(mode, sink, softmax_scale):
  sources, _ = float_pool_sources(41, ("bfloat16", "float32"), sink=sink)
  out, lse = run_triton(mode, sources, num_kv_splits=2, softmax_scale=softmax_scale)
  check(out, lse, pools_oracle(sources, softmax_scale))


def test_float_pools_are_not_packed():
  """The check has the power to tell: the pools packed to fp8 (what the API did before float
  pools were native) give results outside the tolerance of the float-pool oracle."""
  sources, _ = float_pool_sources(42, ("bfloat16", "bfloat16"))
  want = pools_oracle(sources)
  out, lse = run_triton("interpret", sources, num_kv_splits=1)
  check(out, lse, want)
  packed = dataclasses.replace(sources, batch=dataclasses.replace(sources.batch))
  packed.batch.kv, packed.batch.kv_rope = map(np.asarray, jax_mla_pack_rows(
      jnp.asarray(np.nan_to_num(as_f32(sources.batch.kv), nan=0.0, posinf=0.0, neginf=0.0))))
  packed.kv2, packed.kv_rope2 = map(np.asarray, jax_mla_pack_rows(
      jnp.asarray(np.nan_to_num(as_f32(sources.kv2), nan=0.0, posinf=0.0, neginf=0.0))))
  with pytest.raises(AssertionError):
    assert_bf16_decode_close(*pools_oracle(packed), *want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("forms", [("float32", "packed"), ("packed", "float32"),
                                   ("float32", "float32")], ids=["a", "b", "both"])
def test_f32_pools_compute_as_their_bf16_rounding(mode, forms):
  """f32 pools give bit for bit the results of the same pools rounded to bf16 (nearest even)
  first."""
  sources, _ = float_pool_sources(43, forms, tokens_per_seq=4)
  rounded = dataclasses.replace(sources, batch=dataclasses.replace(sources.batch))
  for obj, field in ((rounded.batch, "kv"), (rounded, "kv2")):
    pool = getattr(obj, field)
    if pool.dtype == np.float32:
      bf16 = np.asarray(jnp.asarray(pool).astype(jnp.bfloat16))
      finite = np.isfinite(pool)
      assert not np.array_equal(bf16.astype(np.float32)[finite], pool[finite])  # it rounds
      setattr(obj, field, bf16)
  got = run_triton(mode, sources, num_kv_splits=3)
  want = run_triton(mode, rounded, num_kv_splits=3)
  np.testing.assert_array_equal(got[0], want[0])
  np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("source", ["a", "b"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_a_nan_in_a_listed_float_row_stays_in_its_sequence(mode, source, dtype):
  """A NaN in one value of a row sequence 4 lists makes that sequence's out and lse NaN and no
  other's."""
  forms = (dtype, "bfloat16") if source == "a" else ("bfloat16", dtype)
  sources, _ = float_pool_sources(44, forms)
  pool, indices, indptr = ((sources.batch.kv, sources.batch.kv_indices, sources.batch.kv_indptr)
                           if source == "a" else
                           (sources.kv2, sources.kv_indices2, sources.kv_indptr2))
  pool[row_only_in(indptr, indices, 4), 300] = np.nan
  out, lse = run_triton(mode, sources, num_kv_splits=3)
  assert np.isnan(out[4]).all() and np.isnan(lse[4]).all()
  others = [0, 1, 2, 3]
  want_out, want_lse = pools_oracle(sources)
  check(out[others], lse[others], (want_out[others], want_lse[others]))


EMPTY_SOURCE_FORMS = [("packed", "packed")] + [
    forms for dtype in FLOAT_DTYPES for forms in ((dtype, "packed"), ("packed", dtype),
                                                  (dtype, dtype))]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("forms", EMPTY_SOURCE_FORMS, ids=[f"{a}-{b}" for a, b in
                                                           EMPTY_SOURCE_FORMS])
def test_a_source_with_no_entries_at_all(mode, forms):
  """An empty index list (L = 0) beside a full one, either way round; each pool packed or
  float."""
  for lengths_a, lengths_b in (([7, 90], [0, 0]), ([0, 0], [7, 90])):
    sources, _ = float_pool_sources(45, forms, lengths_a=lengths_a, lengths_b=lengths_b,
                                    sink=0.5)
    if not sum(lengths_b):
      sources.kv_indices2 = sources.kv_indices2[:0]
    else:
      sources.batch.kv_indices = sources.batch.kv_indices[:0]
    out, lse = run_triton(mode, sources, num_kv_splits=2)
    check(out, lse, pools_oracle(sources))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("splits", [1, 2])
def test_a_float_pool_on_one_source(mode, dtype, splits):
  """The one-source kernel (no extra) with a float pool, a scale and float Q."""
  rng = np.random.default_rng(46)
  batch = make_batch(rng, num_heads=64, lengths=[5, 0, 150], sink=0.3, extra_indices=5)
  kv, indices = float_pool(rng, batch.kv, batch.kv_rope, batch.kv_indptr, batch.kv_indices,
                           dtype)
  q = float_query(batch, rng, dtype)
  decode = triton_decoder(mode, 1, splits, SCALE, two_sources=False)
  out, lse = decode(q, None, kv, None, batch.kv_indptr, indices, batch.sink_array())
  keys = token_keys(pool_values(kv, None), batch.kv_indptr, indices, q.shape[0], 1)
  check(as_f32(out), np.asarray(lse), oracle_attend(computed_query(q), keys, batch.sink, SCALE))


@pytest.mark.parametrize("mode", MODES)
def test_float_q_and_float_pools(mode):
  sources, rng = float_pool_sources(47, ("float32", "bfloat16"), num_heads=16, tokens_per_seq=4)
  q = float_query(sources.batch, rng, "float32")
  out, lse = run_triton_float(mode, sources, q, num_kv_splits=3, softmax_scale=SCALE)
  check(out, lse, pools_oracle(sources, SCALE, q=q))


def assert_pools_go_in_as_given(text, custom_call, pool_types):
  """One kernel call; the float pools reach it as the arguments themselves (no gather, no
  conversion, no fp8 packing before it)."""
  lines = text.splitlines()
  calls = [line for line in lines if custom_call in line]
  assert len(calls) == 1, calls
  outside = [line.split(" loc(")[0] for line in lines
             if custom_call not in line and not line.startswith("#loc")]
  assert not any("f8E4M3" in line for line in outside), "a pool was packed before the kernel"
  operands = calls[0].split("(", 1)[1].split(")", 1)[0].split(", ")
  for arg, pool_type in pool_types.items():
    assert arg in operands, (arg, operands)
    assert pool_type in calls[0], pool_type
    # Nothing but the kernel reads the pool: no op outside it (gather, convert) has its type.
    readers = [line for line in outside if pool_type in line and "func.func" not in line]
    assert not readers, f"{arg} is read before the kernel: {readers[:2]}"


def pool_types(args):
  """{argument name: tensor type} of the float pools among decode's arguments `args` (None
  arguments take no number)."""
  element = {"bfloat16": "bf16", "float32": "f32"}
  numbered = [a for a in args if a is not None]
  return {f"%arg{i}": f"tensor<{a.shape[0]}x512x{element[str(a.dtype)]}>"
          for i, a in enumerate(numbered)
          if a.ndim == 2 and a.shape[1] == 512 and str(a.dtype) in element}


def abstract_args(sources):
  """(decode's arguments with the second source's, their abstract values: None stays)."""
  args = [*sources.kernel_args(), *sources.extra()]
  return args, [None if a is None else abstract([a])[0] for a in args]


@pytest.mark.parametrize("forms", POOL_FORMS, ids=POOL_IDS)
@pytest.mark.parametrize("platform", ["rocm", "cuda"])
def test_triton_lowers_float_pools_into_the_kernel(platform, forms):
  sources, _ = float_pool_sources(49, forms, num_heads=128, lengths_a=[5, 7, 0],
                                  lengths_b=[9, 0, 0], sink=0.1)
  args, shapes = abstract_args(sources)
  decode = lambda *a: pd.pallas_decode(*a[:7], tokens_per_seq=1, num_kv_splits=2,
                                       softmax_scale=SCALE, extra=a[7:])
  text = export_for(decode, platform, *shapes,
                    custom_calls=["__gpu$xla.gpu.triton"]).mlir_module()
  types = pool_types(args)
  assert_pools_go_in_as_given(text, "__gpu$xla.gpu.triton",
                              {a: t for a, t in types.items() if t.endswith("xbf16>")})
  # f32 pools: Triton's f32 tiles overflow shared memory (the H200), so XLA gives the kernel
  # their listed rows in bf16.
  call = next(line for line in text.splitlines() if "__gpu$xla.gpu.triton" in line)
  assert not [t for t in types.values() if t.endswith("xf32>") and t in call]


@pytest.mark.parametrize("forms", POOL_FORMS, ids=POOL_IDS)
@pytest.mark.parametrize("num_heads,tokens_per_seq,lengths_a,lengths_b,splits", MOSAIC_SHAPES)
def test_mosaic_lowers_float_pools_for_cuda(num_heads, tokens_per_seq, lengths_a, lengths_b,
                                            splits, forms):
  """Every float-pool form in every kernel family (paired CTAs at 128 heads, the merge kernel at
  40 splits): the pools go into the one Mosaic call as given."""
  sources, _ = float_pool_sources(50, forms, num_heads=num_heads, tokens_per_seq=tokens_per_seq,
                                  lengths_a=lengths_a, lengths_b=lengths_b)
  args, shapes = abstract_args(sources)
  text = export_for(mosaic_decoder(tokens_per_seq, splits, SCALE), "cuda", *shapes,
                    custom_calls=["mosaic_gpu_v2", "__gpu$xla.gpu.triton"]).mlir_module()
  assert_pools_go_in_as_given(text, "mosaic_gpu_v2", pool_types(args))
  assert ("jax_mla_merge_partials" in text) == (splits == 40)


# Interpret mode: every pool form at the first shape, the bf16 ones past it (f32 rows are the
# same kernel after the copy's rounding, checked bit for bit by the edge cases).
@pytest.mark.parametrize(
    "mode,num_heads,tokens_per_seq,lengths_a,lengths_b,splits,forms",
    with_modes_by(MOSAIC_SHAPES, [(forms,) for forms in POOL_FORMS],
                  lambda shape, value: unpaired_few_splits(shape) and (
                      shape == MOSAIC_SHAPES[0] or "float32" not in value[0])))
def test_mosaic_float_pools_match_the_oracle(mode, num_heads, tokens_per_seq, lengths_a,
                                             lengths_b, splits, forms, monkeypatch):
  sources, _ = float_pool_sources(num_heads + tokens_per_seq, forms, num_heads=num_heads,
                                  tokens_per_seq=tokens_per_seq, lengths_a=lengths_a,
                                  lengths_b=lengths_b, pool_a=4096, pool_b=2048,
                                  sink=np.linspace(-1, 1, num_heads).astype(np.float32))
  out, lse = mosaic_call(mode, monkeypatch, mosaic_decoder(tokens_per_seq, splits, SCALE),
                         *sources.kernel_args(), *sources.extra())
  check(as_f32(out), np.asarray(lse), pools_oracle(sources, SCALE))


# Interpret mode: 16 x 4 (each case is about ten decodes; paired: unpaired_few_splits).
@pytest.mark.parametrize("mode,num_heads,tokens_per_seq",
                         with_modes([(16, 4), (64, 1), (128, 1)], lambda shape: shape[0] == 16))
def test_mosaic_float_pool_edge_cases(mode, num_heads, tokens_per_seq, monkeypatch):
  """f32 pools bit for bit as their bf16 rounding; a NaN in a listed row stays in its
  sequence; +inf and no sinks; empty index lists; the one-source kernel with a float pool and
  float Q."""
  sources, rng = float_pool_sources(51, ("float32", "float32"), num_heads=num_heads,
                                    tokens_per_seq=tokens_per_seq)
  decode = functools.partial(mosaic_call, mode, monkeypatch,
                             mosaic_decoder(tokens_per_seq, 2, None))
  out, lse = decode(*sources.kernel_args(), *sources.extra())
  rounded = dataclasses.replace(sources, batch=dataclasses.replace(sources.batch))
  rounded.batch.kv = np.asarray(jnp.asarray(sources.batch.kv).astype(jnp.bfloat16))
  rounded.kv2 = np.asarray(jnp.asarray(sources.kv2).astype(jnp.bfloat16))
  out16, lse16 = decode(*rounded.kernel_args(), *rounded.extra())
  np.testing.assert_array_equal(as_f32(out), as_f32(out16))
  np.testing.assert_array_equal(np.asarray(lse), np.asarray(lse16))
  check(as_f32(out), np.asarray(lse), pools_oracle(sources))

  for source in ("a", "b"):
    nan, _ = float_pool_sources(52, ("bfloat16", "float32"), num_heads=num_heads,
                                tokens_per_seq=tokens_per_seq)
    pool, indices, indptr = ((nan.batch.kv, nan.batch.kv_indices, nan.batch.kv_indptr)
                             if source == "a" else (nan.kv2, nan.kv_indices2, nan.kv_indptr2))
    pool[row_only_in(indptr, indices, 4), 300] = np.nan
    out, lse = decode(*nan.kernel_args(), *nan.extra())
    out, lse = as_f32(out), np.asarray(lse)
    rows = slice(4 * tokens_per_seq, 5 * tokens_per_seq)
    assert np.isnan(out[rows]).all() and np.isnan(lse[rows]).all()
    want_out, want_lse = pools_oracle(nan)
    check(out[:rows.start], lse[:rows.start], (want_out[:rows.start], want_lse[:rows.start]))

  for sink in (None, np.inf):
    sinks, _ = float_pool_sources(53, ("bfloat16", "bfloat16"), num_heads=num_heads,
                                  tokens_per_seq=tokens_per_seq, sink=sink)
    out, lse = decode(*sinks.kernel_args(), *sinks.extra())
    check(as_f32(out), np.asarray(lse), pools_oracle(sinks))

  for forms in (("bfloat16", "float32"), ("packed", "bfloat16")):
    empty, _ = float_pool_sources(54, forms, num_heads=num_heads, tokens_per_seq=tokens_per_seq,
                                  lengths_a=[7, 90], lengths_b=[0, 0], sink=0.5)
    empty.kv_indices2 = empty.kv_indices2[:0]
    out, lse = decode(*empty.kernel_args(), *empty.extra())
    check(as_f32(out), np.asarray(lse), pools_oracle(empty))

  from jax_mla._src.pallas.mosaic import decode as md  # pylint: disable=import-outside-toplevel
  batch = make_batch(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq,
                     lengths=[5, 0, 150, 70], pool_rows=2048, sink=0.3, extra_indices=5)
  kv, indices = float_pool(rng, batch.kv, batch.kv_rope, batch.kv_indptr, batch.kv_indices,
                           "bfloat16")
  q = float_query(batch, rng, "float32")
  one = functools.partial(md.mosaic_decode, tokens_per_seq=tokens_per_seq, num_kv_splits_=1,
                          softmax_scale=SCALE)
  out, lse = mosaic_call(mode, monkeypatch, one, q, None, kv, None, batch.kv_indptr, indices,
                         batch.sink_array())
  keys = token_keys(pool_values(kv, None), batch.kv_indptr, indices, q.shape[0], tokens_per_seq)
  check(as_f32(out), np.asarray(lse), oracle_attend(computed_query(q), keys, batch.sink, SCALE))
