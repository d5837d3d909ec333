"""The Pallas kernels with two KV sources in one call (`extra=`: DeepSeek-V4's sliding window
and compressed top-k, each its own pool) and a softmax scale other than 1/sqrt(512).

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
from support.oracle import dequantize_rows, oracle_decode
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


def oracle(sources, softmax_scale=None):
  """oracle_decode on the one-pool problem; another softmax scale by scaled_oracle."""
  args = sources.one_pool()
  if softmax_scale is None:
    return oracle_decode(*args, sources.batch.tokens_per_seq)
  return scaled_oracle(*args, sources.batch.tokens_per_seq, softmax_scale)


def scaled_oracle(q_packed, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, tokens_per_seq,
                  softmax_scale):
  """float64 decode with scores q.k * softmax_scale, from the oracle's bit-level row decoder
  (oracle_decode fixes the scale at 1/sqrt(512); test_scaled_oracle_is_the_oracle holds this
  to it there). Sinks of +-inf and empty lists as oracle_decode."""
  q = dequantize_rows(q_packed, q_rope)
  num_heads = q.shape[1]
  sink = np.full(num_heads, -np.inf) if sink is None else np.asarray(sink, np.float64)
  out = np.zeros(q.shape)
  lse = np.zeros(q.shape[:2])
  for b in range(len(kv_indptr) - 1):
    rows = kv_indices[kv_indptr[b]:kv_indptr[b + 1]]
    keys = dequantize_rows(kv[rows], kv_rope[rows])
    for t in range(b * tokens_per_seq, (b + 1) * tokens_per_seq):
      # Columns: the entries' scores, then the sink's.
      logits = np.concatenate([q[t] @ keys.T * softmax_scale, sink[:, None]], axis=1)
      m = logits.max(axis=1, keepdims=True)
      m = np.where(np.isfinite(m), m, 0.0)
      w = np.exp(logits - m)
      denom = w.sum(axis=1)
      # Nothing seen and no sink: denom 0, lse -inf. A +inf sink: w = inf / inf. Out 0 in both.
      zero = (np.isposinf(sink) | (denom == 0))[:, None]
      with np.errstate(invalid="ignore", divide="ignore"):
        lse[t] = m[:, 0] + np.log(denom)
        out[t] = np.where(zero, 0.0, w[:, :-1] @ keys / denom[:, None])
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
