"""The Pallas kernels with two KV sources in one call (`extra=`: DeepSeek-V4's sliding window
and compressed top-k, each its own pool), a softmax scale other than 1/sqrt(512), and Q as the
model holds it (bf16 or f32 values [T, H, 512], q_rope None: read by the kernels as they are,
f32 rounded to bf16).

The expected results come from the float64 oracle on one pool: the two pools concatenated and
the second source's indices offset into the copy, each sequence's two lists joined. That path
shares nothing with the kernels' split of a sequence's blocks between the sources. The Triton
kernel runs in Pallas interpret mode (and compiled on a GPU: marked `gpu`); the Mosaic kernel is
lowered for an H200 here and runs against the same oracle on an sm90 GPU (marked `gpu`).
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
from test_mosaic import GPU as HOPPER
from test_pallas import MODES  # Pallas interpret mode, and compiled through Triton on a GPU

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
def test_a_source_with_no_entries_at_all(mode):
  """An empty index list (L2 = 0) beside a full one, and the other way round."""
  rng = np.random.default_rng(5)
  for lengths_a, lengths_b in (([7, 90], [0, 0]), ([0, 0], [7, 90])):
    sources = make_two_sources(rng, num_heads=16, lengths_a=lengths_a, lengths_b=lengths_b,
                               sink=0.5)
    if not sum(lengths_b):
      sources.kv_indices2 = sources.kv_indices2[:0]
    else:
      sources.batch.kv_indices = sources.batch.kv_indices[:0]
    out, lse = run_triton(mode, sources, num_kv_splits=2)
    check(out, lse, oracle(sources))


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


def test_one_executable_serves_every_set_of_lengths():
  rng = np.random.default_rng(7)
  traces = []

  def decode(*args):
    traces.append(1)
    return pd.pallas_decode(*args[:7], tokens_per_seq=1, num_kv_splits=None, extra=args[7:],
                            interpret=True)

  jitted = jax.jit(decode)
  # The same totals per source: the same index-list shapes.
  for lengths_a, lengths_b in (([10, 20, 30], [60, 0, 40]), ([0, 0, 60], [0, 100, 0]),
                               ([59, 1, 0], [1, 1, 98])):
    sources = make_two_sources(rng, num_heads=16, lengths_a=lengths_a, lengths_b=lengths_b,
                               sink=0.0)
    out, lse = jitted(*sources.kernel_args(), *sources.extra())
    check(as_f32(out), np.asarray(lse), oracle(sources))
  assert len(traces) == 1


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


@pytest.mark.gpu
@HOPPER
@pytest.mark.parametrize("softmax_scale", [None, SCALE])
@pytest.mark.parametrize("num_heads,tokens_per_seq,lengths_a,lengths_b,splits", MOSAIC_SHAPES)
def test_mosaic_two_sources_match_the_oracle(num_heads, tokens_per_seq, lengths_a, lengths_b,
                                             splits, softmax_scale):
  sources = make_two_sources(np.random.default_rng(num_heads + tokens_per_seq),
                             num_heads=num_heads, tokens_per_seq=tokens_per_seq,
                             lengths_a=lengths_a, lengths_b=lengths_b, pool_a=4096,
                             pool_b=2048, sink=0.3)
  out, lse = jax.jit(mosaic_decoder(tokens_per_seq, splits, softmax_scale))(
      *sources.kernel_args(), *sources.extra())
  check(as_f32(out), np.asarray(lse), oracle(sources, softmax_scale))


@pytest.mark.gpu
@HOPPER
@pytest.mark.parametrize("sink", [None, np.inf])
@pytest.mark.parametrize("num_heads", [64, 128])
def test_mosaic_two_sources_edge_cases(num_heads, sink):
  """A NaN row in source B (its sequence only), +inf sinks, an empty second list."""
  rng = np.random.default_rng(11)
  sources = make_two_sources(rng, num_heads=num_heads, lengths_a=LENGTHS_A,
                             lengths_b=LENGTHS_B, sink=sink)
  if sink is None:
    sources.kv2[sources.kv_indices2[sources.kv_indptr2[4]], 448:450] = 0xFF
  decode = jax.jit(mosaic_decoder(1, 2, None))
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


@pytest.mark.gpu
@HOPPER
@pytest.mark.parametrize("softmax_scale", [None, SCALE])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("num_heads,tokens_per_seq,lengths_a,lengths_b,splits", MOSAIC_SHAPES)
def test_mosaic_float_q_matches_the_oracle(num_heads, tokens_per_seq, lengths_a, lengths_b,
                                           splits, dtype, softmax_scale):
  rng = np.random.default_rng(num_heads + tokens_per_seq)
  sources = make_two_sources(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq,
                             lengths_a=lengths_a, lengths_b=lengths_b, pool_a=4096,
                             pool_b=2048, sink=rng.normal(size=num_heads).astype(np.float32))
  q = float_query(sources.batch, rng, dtype)
  out, lse = jax.jit(mosaic_float_decoder(tokens_per_seq, splits, softmax_scale))(
      *float_args(sources, q), *sources.extra())
  check(as_f32(out), np.asarray(lse), oracle(sources, softmax_scale, q=q))


@pytest.mark.gpu
@HOPPER
@pytest.mark.parametrize("num_heads,tokens_per_seq", [(16, 4), (64, 1), (128, 1)])
def test_mosaic_float_q_edge_cases(num_heads, tokens_per_seq):
  """f32 Q bit for bit as its bf16 rounding; a NaN in one (token, head) of Q stays in that
  row; +inf and no sinks; the one-source kernel (no extra) with float Q."""
  rng = np.random.default_rng(28)
  sources = make_two_sources(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq,
                             lengths_a=LENGTHS_A, lengths_b=LENGTHS_B, sink=0.3)
  q = float_query(sources.batch, rng, "float32")
  decode = jax.jit(mosaic_float_decoder(tokens_per_seq, 2, None))
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
  one = jax.jit(lambda q, *a: md.mosaic_decode(q, None, *a, tokens_per_seq=tokens_per_seq,
                                               num_kv_splits_=1, softmax_scale=SCALE))
  out, lse = one(q, *batch.args()[2:-1], batch.sink_array())
  check(as_f32(out), np.asarray(lse),
        values_oracle(computed_query(q), *batch.args()[2:], tokens_per_seq, SCALE))
