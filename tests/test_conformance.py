"""The decode contracts, each written once and run on every backend that claims the capability.

A backend's capabilities come from the registry (jax_mla._src.backends): the (heads, tokens)
layouts it serves for `decode` and `decode_persistent`. Backends here:

- reference, host: on the CPU, in CI;
- pallas_interpret: backend="pallas" with its Triton kernel in Pallas interpret mode on the CPU;
- pallas: the real kernels (Mosaic GPU on Hopper, Triton elsewhere), `-m gpu`;
- gfx950: AMD's code objects on an MI355X, `-m gfx950` (skipped elsewhere with the reason).

Contracts (docs/contracts.md): agreement with the float64 oracle; sinks (finite, -inf, +inf,
per head); rows without entries (out = 0, lse = sink); padding bytes never read; a NaN in a used
row makes exactly that sequence NaN; NaN in rows nobody indexes never leaks; one executable for
every set of lengths; the persistent API equal to decode; layouts a backend does not serve
refused with the reason; differentiation (the reference's gradient, the kernel backends'
refusal). DeepSeek-V4 as served: two KV sources in one call, per-query-token
lists, bf16/f32 Q, unquantized pools and `softmax_scale`, each in the form the backend computes
it (natively, or as the API adapts it for the backend: `Backend.native`, adapters.py).

The contract calls go through `jax.jit`, one jitted function per (API, backend, static options)
kept for the module (`jitted`): the cases of one shape share an executable (an eager call of
the Pallas backend in interpret mode compiles its kernel every time, about 1.5 s).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mla
from jax_mla._src import backends, layout
from jax_mla._src.pallas import backend as pallas_backend
from support.compare import assert_bf16_decode_close, assert_bit_identical
from support.compare import assert_close
from support.oracle import dequantize_rows, oracle_attend, oracle_decode, token_keys
from support.rows import POISON_PATTERNS, make_batch, make_source, poison_padding


def _on_gpu() -> bool:
  return jax.default_backend() in ("gpu", "cuda", "rocm")


BACKENDS = [
    "reference",
    "host",
    "pallas_interpret",
    pytest.param("pallas", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not _on_gpu(), reason=f"needs a CUDA or ROCm GPU; the default backend is "
        f"{jax.default_backend()!r}")]),
    pytest.param("gfx950", marks=pytest.mark.gfx950),
]


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
  """The `backend=` to pass; pallas_interpret swaps the device's kernel for the Triton one in
  interpret mode (jax_mla._src.pallas.backend.device_kernel)."""
  name = request.param
  if name == "pallas_interpret":
    if _on_gpu():
      pytest.skip("interpret mode stands in for the GPU on CPU machines only")
    monkeypatch.setattr(pallas_backend, "device_kernel", lambda: ("triton", "interpret mode"))
    monkeypatch.setattr(pallas_backend, "_interpret", lambda: True)
    return "pallas"
  if name == "host" and not backends.host_available()[0]:
    pytest.fail(f"the host backend must run here: {backends.host_available()[1]}")
  if name in ("reference", "host") and _on_gpu():
    pytest.skip("the CPU backends run in the CPU suite")
  return name


@functools.lru_cache(maxsize=None)
def _jitted(api, backend, options):
  fn = jax_mla.decode if api == "decode" else jax_mla.decode_persistent
  return jax.jit(functools.partial(fn, backend=backend, **dict(options)))


def jitted(api, backend, **options):
  """jax_mla.decode or decode_persistent (`api`) with these static keywords, jitted once per
  module: a trace made under the pallas_interpret fixture's patch serves only that backend's
  cases (a run with a GPU skips pallas_interpret)."""
  return _jitted(api, backend, tuple(sorted(options.items())))


def decode(batch, backend, **kwargs):
  out, lse = jitted("decode", backend, tokens_per_seq=batch.tokens_per_seq, **kwargs)(
      *batch.args())
  return np.asarray(jnp.asarray(out, jnp.float32)), (None if lse is None else np.asarray(lse))


def run_api(batch, backend, api, **kwargs):
  """(out f32, lse) through `decode` (kwargs go to it) or `decode_persistent` (one token per
  row)."""
  if api == "decode":
    return decode(batch, backend, **kwargs)
  workspace = jax_mla.make_workspace(num_partitions=8, max_rows=batch.q.shape[0])
  out, lse, workspace = jitted("persistent", backend)(*batch.args(), workspace)
  assert not np.asarray(workspace.cnt).any(), "the arrival counters must be back at zero"
  return np.asarray(jnp.asarray(out, jnp.float32)), np.asarray(lse)


APIS = ["decode", "persistent"]


def api_heads(backend, api, default):
  """The head count a contract test uses: the persistent layouts' for decode_persistent."""
  return layouts(backend, persistent=True)[0][0] if api == "persistent" else default


def layouts(backend, persistent=False):
  entry = backends.REGISTRY[backend]
  return entry.persistent_layouts() if persistent else entry.decode_layouts()


def served(backend, num_heads, tokens_per_seq=1):
  found = layouts(backend)
  return found is None or (num_heads, tokens_per_seq) in found


def check_oracle(batch, out, lse):
  assert_bf16_decode_close(out, lse, *oracle_decode(*batch.args(), batch.tokens_per_seq))


# --- agreement with the oracle --------------------------------------------------------------------

@pytest.mark.parametrize("num_heads,tokens_per_seq,lengths", [
    (128, 1, [37, 0, 150, 1]), (64, 1, [200, 3]), (32, 1, [5, 64]), (16, 4, [0, 70, 9]),
    (16, 2, [33, 1]), (8, 1, [12, 0, 40])])
def test_matches_the_oracle(backend, num_heads, tokens_per_seq, lengths):
  if not served(backend, num_heads, tokens_per_seq):
    pytest.skip(f"{backend} does not serve ({num_heads}, {tokens_per_seq})")
  rng = np.random.default_rng(num_heads * 10 + tokens_per_seq)
  batch = make_batch(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq, lengths=lengths,
                     pool_rows=256, sink=rng.normal(size=num_heads).astype(np.float32),
                     extra_indices=5)
  out, lse = decode(batch, backend)
  assert np.isfinite(out).all() and np.isfinite(lse).all()
  check_oracle(batch, out, lse)


@pytest.mark.parametrize("num_kv_splits", [2, 5])
def test_split_counts_agree_with_the_oracle(backend, num_kv_splits):
  batch = make_batch(np.random.default_rng(3), num_heads=64, lengths=[300, 0, 17], pool_rows=256,
                     sink=0.4)
  out, lse = decode(batch, backend, num_kv_splits=num_kv_splits)
  assert np.isfinite(out).all() and np.isfinite(lse).all()
  check_oracle(batch, out, lse)


@pytest.mark.parametrize("pattern", ["random", "unique", "reversed", "same", "last"])
def test_index_patterns_agree_with_the_oracle(backend, pattern):
  batch = make_batch(np.random.default_rng(len(pattern)), num_heads=16, lengths=[0, 33, 257, 2],
                     pool_rows=256, sink=-0.7, index_pattern=pattern)
  out, lse = decode(batch, backend)
  assert np.isfinite(out).all() and np.isfinite(lse).all()
  check_oracle(batch, out, lse)


@pytest.mark.parametrize("num_heads", [64, 128])
def test_scores_rising_along_the_list(backend, num_heads):
  """Each block of 64 entries scores about twice the one before (its K rows' tile scales one
  exponent higher): the softmax's running max moves block after block, by less and by more
  than a kernel may leave it stale (the Mosaic kernel's consumer.MAX_SLACK_LOG2)."""
  if not served(backend, num_heads):
    pytest.skip(f"{backend} does not serve ({num_heads}, 1)")
  batch = make_batch(np.random.default_rng(11), num_heads=num_heads, lengths=[448, 130],
                     pool_rows=1024, sink=0.3, index_pattern="unique")
  kv = np.array(batch.kv)
  scales = slice(layout.SCALE_OFFSET, layout.SCALE_OFFSET + layout.SCALE_BYTES)
  for seq in range(2):
    rows = batch.kv_indices[batch.kv_indptr[seq]:batch.kv_indptr[seq + 1]]
    kv[rows, scales] += (np.arange(len(rows)) // 64).astype(np.uint8)[:, None]
  batch.kv = kv
  out, lse = decode(batch, backend)
  assert np.isfinite(out).all() and np.isfinite(lse).all()
  check_oracle(batch, out, lse)


def test_return_lse_false_gives_the_same_out(backend):
  batch = make_batch(np.random.default_rng(4), num_heads=64, lengths=[90, 0, 4], pool_rows=128,
                     sink=0.1)
  out, lse = decode(batch, backend)
  out_only, none = decode(batch, backend, return_lse=False)
  assert none is None and np.isfinite(out_only).all()
  check_oracle(batch, out_only, None)
  check_oracle(batch, out, lse)


# --- sinks and rows without entries ---------------------------------------------------------------

@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("sink", ["none", "finite", "per_head", "random"])
def test_sinks_and_empty_rows(backend, sink, api):
  num_heads = api_heads(backend, api, 64)
  # "random": values that log2 units do not round-trip exactly (the lse of an empty row is
  # the sink itself).
  sink = {"none": None, "finite": 1.5,
          "per_head": np.array([-np.inf, 0.0, 5.0, np.inf] * (num_heads // 4), np.float32),
          "random": np.random.default_rng(55).normal(size=num_heads).astype(np.float32)}[sink]
  batch = make_batch(np.random.default_rng(5), num_heads=num_heads, lengths=[0, 40, 0, 7],
                     pool_rows=128, sink=sink)
  out, lse = run_api(batch, backend, api)
  want_lse = batch.sink_array()
  for t in (0, 2):  # empty sequences: out = 0 and lse = sink, exactly
    assert not out[t].any(), f"row {t} of an empty sequence is not zero"
    np.testing.assert_array_equal(lse[t], want_lse)
  check_oracle(batch, out, lse)


def test_a_plus_inf_sink_gives_zero_out(backend):
  sink = np.full(64, np.inf, np.float32)
  batch = make_batch(np.random.default_rng(6), num_heads=64, lengths=[25, 0], pool_rows=64,
                     sink=sink)
  out, lse = decode(batch, backend)
  assert not out.any()
  np.testing.assert_array_equal(lse, np.full_like(lse, np.inf))


# --- what is never read, and NaN ------------------------------------------------------------------

@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("where", ["kv", "q"])
@pytest.mark.parametrize("pattern", POISON_PATTERNS)
def test_padding_bytes_never_change_a_result(backend, where, pattern, api):
  batch = make_batch(np.random.default_rng(7), num_heads=api_heads(backend, api, 64),
                     lengths=[30, 0, 9], pool_rows=64, sink=0.2)
  clean = run_api(batch, backend, api)
  setattr(batch, where, poison_padding(getattr(batch, where), pattern))
  poisoned = run_api(batch, backend, api)
  assert np.isfinite(clean[0]).all()
  assert_bit_identical("out", poisoned[0], clean[0], what="the result without poison")
  assert_bit_identical("lse", poisoned[1], clean[1], what="the result without poison")


def test_nan_rows_nobody_indexes_never_leak(backend):
  batch = make_batch(np.random.default_rng(8), num_heads=64, lengths=[20, 0, 11], pool_rows=96,
                     index_pattern="unique", extra_indices=8, sink=0.3)
  clean = decode(batch, backend)
  batch.poison_unindexed_rows()
  poisoned = decode(batch, backend)
  assert np.isfinite(clean[0]).all() and np.isfinite(poisoned[0]).all()
  assert_bit_identical("out", poisoned[0], clean[0], what="the result without poisoned rows")
  assert_bit_identical("lse", poisoned[1], clean[1], what="the result without poisoned rows")


# id: (api, heads (None: the persistent layout's), tokens_per_seq, length of sequence 1, the entry
# of it that holds the NaN, decode kwargs).
NAN_CASES = {
    "decode": ("decode", 16, 4, 12, 5, {}),
    "persistent": ("persistent", None, 1, 12, 5, {}),
    # The split path runs 8 heads padded to 16 and slices the padding off.
    "eight_heads": ("decode", 8, 1, 12, 5, {}),
    # One split: the kernel writes the bf16 out itself, no merge; only the empty-row fix-up after.
    "one_split": ("decode", 16, 1, 12, 5, {"num_kv_splits": 1, "return_lse": False}),
    # Entry 32 of 33 is alone in the second split of the host kernel (32-entry tiles): that
    # split's running max stays -inf, as if it saw nothing.
    "alone_in_a_split": ("decode", 16, 1, 33, 32, {"num_kv_splits": 2}),
}
# Where the NaN goes: the first copy of tile 3's e8m0 scale (the copy at 449 + 2k is never
# read), or an fp8 e4m3fn NaN code (0x7F, or 0xFF with the sign bit) among the 448 fp8 bytes.
NAN_BYTES = {"scale": (448 + 2 * 3, 0xFF), "fp8": (100, 0x7F), "fp8_negative": (5, 0xFF)}


@pytest.mark.parametrize("case", list(NAN_CASES))
@pytest.mark.parametrize("nan", list(NAN_BYTES))
def test_a_nan_in_a_used_row_makes_that_sequence_nan(backend, nan, case):
  """A NaN in a row sequence 1 uses: its out and lse are NaN, every other sequence is
  bit-identical to the run without it (also the empty one), through every path of a backend."""
  api, num_heads, tokens, length, entry, kwargs = NAN_CASES[case]
  num_heads = num_heads or api_heads(backend, api, 0)
  if api == "decode" and not served(backend, num_heads, tokens):
    pytest.skip(f"{backend} does not serve ({num_heads}, {tokens})")
  batch = make_batch(np.random.default_rng(9), num_heads=num_heads, tokens_per_seq=tokens,
                     lengths=[12, length, 0, 12], pool_rows=64, index_pattern="unique",
                     sink=0.5)
  clean_out, clean_lse = run_api(batch, backend, api, **kwargs)
  assert np.isfinite(clean_out).all()
  assert clean_lse is None or np.isfinite(clean_lse).all()
  offset, code = NAN_BYTES[nan]
  batch.kv[batch.kv_indices[batch.kv_indptr[1] + entry], offset] = code
  out, lse = run_api(batch, backend, api, **kwargs)
  hit = slice(tokens, 2 * tokens)
  assert np.isnan(out[hit]).all(), "the sequence with the NaN row is not all NaN"
  assert lse is None or np.isnan(lse[hit]).all(), "its lse is not all NaN"
  others = np.r_[0:tokens, 2 * tokens:4 * tokens]
  assert_bit_identical("out", out[others], clean_out[others], what="the sequences without NaN")
  if lse is not None:
    assert_bit_identical("lse", lse[others], clean_lse[others], what="the sequences without NaN")


# --- one executable; the persistent API; layouts not served ---------------------------------------

def test_one_executable_serves_every_set_of_lengths(backend):
  rng = np.random.default_rng(10)
  batches = [make_batch(rng, num_heads=64, lengths=lengths, pool_rows=64, sink=0.1,
                        extra_indices=70 - sum(lengths))  # one index-list length for all
             for lengths in ([5, 0, 60], [33, 33, 1], [0, 0, 0])]
  # A first call imports the backend's modules, and an import that defines jax config options
  # changes the tracing context: warm up outside the jit being counted.
  decode(batches[0], backend)
  traces = []

  @jax.jit
  def run(*args):
    traces.append(1)
    return jax_mla.decode(*args, backend=backend)

  for batch in batches:
    out, lse = run(*batch.args())
    check_oracle(batch, np.asarray(jnp.asarray(out, jnp.float32)), np.asarray(lse))
  assert len(traces) == 1


def test_the_persistent_api_equals_decode(backend):
  heads = layouts(backend, persistent=True)[0][0]
  batch = make_batch(np.random.default_rng(11), num_heads=heads, lengths=[50, 0, 3], pool_rows=64,
                     sink=0.2)
  workspace = jax_mla.make_workspace(num_partitions=8, max_rows=4)
  out, lse, workspace = jax_mla.decode_persistent(*batch.args(), workspace, backend=backend)
  out = np.asarray(jnp.asarray(out, jnp.float32))
  assert np.isfinite(out).all()
  check_oracle(batch, out, np.asarray(lse))
  assert not np.asarray(workspace.cnt).any(), "the arrival counters must be back at zero"
  out0, lse0, _ = jax_mla.decode_persistent(*make_batch(
      np.random.default_rng(12), num_heads=heads, lengths=[], pool_rows=8).args(), workspace,
      backend=backend)
  assert out0.shape == (0, heads, 512) and lse0.shape == (0, heads)


def test_layouts_not_served_are_refused_naming_the_alternative(backend):
  served_layouts = layouts(backend)
  if served_layouts is None:
    pytest.skip(f"{backend} serves every layout")
  batch = make_batch(np.random.default_rng(13), num_heads=24, lengths=[3], pool_rows=8)
  with pytest.raises(ValueError, match=r"serves \(num_heads, tokens_per_seq\) in .*got \(24, 1\)"
                                       r".*backend='reference' serves any shape"):
    jax_mla.decode(*batch.args(), backend=backend)


# --- differentiation -----------------------------------------------------------------------------

def _attention_grad_oracle(queries, keys, sink, weights, scale):
  """float64 d(sum(weights * out)) / d(queries) of oracle_attend, from the softmax's derivative:
  for each row, scale * sum_n p_n (w . k_n - w . out) k_n, p_n = exp(s_n - lse) (the sink a
  constant inside lse)."""
  out, lse = oracle_attend(queries, keys, sink, scale)
  grad = np.zeros_like(out)
  for t, k in enumerate(keys):
    k = np.asarray(k, np.float64)
    p = np.exp(queries[t] @ k.T * scale - lse[t][:, None])  # [H, K_t]
    w_dot_k = weights[t] @ k.T  # [H, K_t]
    w_dot_out = np.sum(weights[t] * out[t], axis=-1, keepdims=True)  # [H, 1]
    grad[t] = scale * (p * (w_dot_k - w_dot_out)) @ k
  return grad


def test_differentiation_is_the_references_only(backend):
  """The reference is plain JAX: its gradient of sum(w * out) with respect to float Q is the
  oracle's. The kernel backends refuse a tangent with an error naming them, and still decode
  inside a differentiated program where no tangent reaches them."""
  rng = np.random.default_rng(14)
  batch = make_batch(rng, num_heads=16, lengths=[40, 0, 7], pool_rows=64, sink=0.3)
  queries = rng.standard_normal((3, 16, 512)).astype(np.float32) * 0.5
  # bf16 values: the cotangent of the bf16 out enters the backward pass exactly.
  weights = np.asarray(jnp.asarray(rng.standard_normal((3, 16, 512)), jnp.bfloat16), np.float32)
  loss = lambda q: jnp.sum(weights * jax_mla.decode(
      q, None, *batch.args()[2:], backend=backend)[0].astype(jnp.float32))
  if backend != "reference":
    with pytest.raises(NotImplementedError, match=rf"backend='{backend}' is forward only"):
      jax.grad(loss)(queries)
    workspace = jax_mla.make_workspace(num_partitions=8, max_rows=3)
    persistent = make_batch(rng, num_heads=128, lengths=[9, 1, 0], pool_rows=64, sink=0.3)
    with pytest.raises(NotImplementedError, match=rf"backend='{backend}' is forward only"):
      jax.grad(lambda q: jnp.sum(jax_mla.decode_persistent(
          q, None, *persistent.args()[2:], workspace, backend=backend)[0].astype(jnp.float32)))(
              rng.standard_normal((3, 128, 512)).astype(np.float32))
    # No tangent reaches the decode (its Q stopped): the program differentiates and decodes.
    grad = jax.grad(lambda x: jnp.sum(x * jax.lax.stop_gradient(loss(jax.lax.stop_gradient(
        x * queries)))))(np.float32(2.0))
    want = np.sum(weights * oracle_for(backend, 2 * queries, None, [batch.args()[2:6]],
                                       batch.sink, 1)[0])
    assert np.isfinite(grad) and abs(float(grad) - want) <= 5e-3 * abs(want)
    return
  grad = np.asarray(jax.grad(loss)(queries))
  keys = token_keys(dequantize_rows(batch.kv, batch.kv_rope), batch.kv_indptr, batch.kv_indices,
                    3, 1)
  want = _attention_grad_oracle(queries.astype(np.float64), keys, batch.sink_array(),
                                weights.astype(np.float64), KERNEL_SCALE)
  assert np.isfinite(grad).all()
  assert not grad[1].any(), "a sequence without entries has no gradient"
  assert_close("d loss / d q", grad, want, atol=1e-3, rtol=1e-5, cos_tol=1e-9)


# --- DeepSeek-V4 as served: two sources, per-token lists, model-precision inputs ------------------

KERNEL_SCALE = 1 / np.sqrt(512)


def _values(x) -> np.ndarray:
  return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def pool_values(backend, kv, kv_rope):
  """The pool values a backend computes with: packed rows as they are; unquantized rows as they
  are where the backend reads them natively (pallas: in bf16, f32 rounded to nearest even),
  else packed (adapters.packed_source)."""
  if kv_rope is not None:
    return dequantize_rows(kv, kv_rope)
  if "float_kv" in backends.REGISTRY[backend].native:
    if backend == "pallas":  # its kernels compute with the pool in bf16
      return _values(jnp.asarray(kv).astype(jnp.bfloat16))
    return _values(kv)
  return dequantize_rows(*map(np.asarray, jax_mla.pack_rows(jnp.asarray(kv))))


def effective_query(backend, q, q_rope, softmax_scale):
  """(query values, scale) a backend computes with, per the documented contract: exact where it
  takes the scale and the Q form natively; Q packed where it needs fp8 rows; the scale folded
  into Q before packing where its kernel's scale is fixed."""
  native = backends.REGISTRY[backend].native
  scale = KERNEL_SCALE if softmax_scale is None else softmax_scale
  values = _values(q) if q_rope is None else dequantize_rows(q, q_rope)
  if "softmax_scale" not in native and scale != KERNEL_SCALE:
    packed = jax_mla.pack_rows(jnp.asarray(values * (scale / KERNEL_SCALE), jnp.float32))
    return dequantize_rows(*map(np.asarray, packed)), KERNEL_SCALE
  if q_rope is None and "float_q" not in native:
    return dequantize_rows(*map(np.asarray, jax_mla.pack_rows(jnp.asarray(q)))), scale
  if q_rope is None and backend == "pallas":  # its kernels compute with Q in bf16
    return _values(jnp.asarray(q).astype(jnp.bfloat16)), scale
  return values, scale


def oracle_for(backend, q, q_rope, given, sink, tokens_per_seq, softmax_scale=None, exact=False):
  """The float64 oracle over the union of `given` sources ([(kv, kv_rope, indptr, indices)]):
  with the inputs the backend computes with, or (exact=True) with the inputs as given."""
  if exact:
    queries = _values(q) if q_rope is None else dequantize_rows(q, q_rope)
    scale = KERNEL_SCALE if softmax_scale is None else softmax_scale
  else:
    queries, scale = effective_query(backend, q, q_rope, softmax_scale)
  num_tokens = queries.shape[0]
  keys = [[] for _ in range(num_tokens)]
  for kv, kv_rope, indptr, indices in given:
    values = (_values(kv) if kv_rope is None else dequantize_rows(kv, kv_rope)) if exact else \
        pool_values(backend, kv, kv_rope)
    for t, k in enumerate(token_keys(values, indptr, indices, num_tokens, tokens_per_seq)):
      keys[t].append(k)
  return oracle_attend(queries, [np.concatenate(k) for k in keys], sink, scale)


def decode_sources(backend, q, q_rope, given, sink, tokens_per_seq, **kwargs):
  main, extra = given[0], (jax_mla.KVSource(*given[1]) if len(given) > 1 else None)
  out, lse = jitted("decode", backend, tokens_per_seq=tokens_per_seq, **kwargs)(
      q, q_rope, *main, sink, extra=extra)
  return _values(out), (None if lse is None else np.asarray(lse))


def check_finite_and_close(out, lse, want):
  assert np.isfinite(out).all() and np.isfinite(lse).all()
  assert_bf16_decode_close(out, lse, *want)


@pytest.mark.parametrize("num_heads,tokens_per_seq,lengths,extra_lengths", [
    (128, 1, [37, 0, 150, 0], [5, 64, 0, 0]), (64, 1, [200, 3], [0, 129]),
    (16, 4, [0, 70, 9], [12, 0, 300])])
def test_two_sources_are_one_softmax(backend, num_heads, tokens_per_seq, lengths, extra_lengths):
  """extra=: the softmax over the union of both sources' entries, one sink, one lse; padding
  bytes of both pools poisoned (0xFF would read as NaN scales)."""
  if not served(backend, num_heads, tokens_per_seq):
    pytest.skip(f"{backend} does not serve ({num_heads}, {tokens_per_seq})")
  rng = np.random.default_rng(num_heads + tokens_per_seq)
  batch = make_batch(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq, lengths=lengths,
                     pool_rows=256, sink=rng.normal(size=num_heads).astype(np.float32),
                     extra_indices=5)
  extra = make_source(rng, extra_lengths, pool_rows=96)
  extra = (poison_padding(extra[0], "ff"), *extra[1:])
  main = (poison_padding(batch.kv, "ff"), batch.kv_rope, batch.kv_indptr, batch.kv_indices)
  out, lse = decode_sources(backend, batch.q, batch.q_rope, [main, extra], batch.sink,
                            tokens_per_seq)
  # Sequences with entries in neither source: out 0, lse = sink, exactly.
  empty = np.repeat((np.diff(batch.kv_indptr) == 0) & (np.diff(extra[2]) == 0), tokens_per_seq)
  assert not out[empty].any()
  np.testing.assert_array_equal(lse[empty], np.broadcast_to(batch.sink, lse[empty].shape))
  check_finite_and_close(out, lse, oracle_for(backend, batch.q, batch.q_rope, [main, extra],
                                              batch.sink, tokens_per_seq))


@pytest.mark.parametrize("case", ["plus_inf_sink", "nan_in_extra", "return_lse_false"])
def test_two_source_edge_contracts(backend, case):
  rng = np.random.default_rng(21)
  sink = np.full(64, np.inf if case == "plus_inf_sink" else 0.3, np.float32)
  batch = make_batch(rng, num_heads=64, lengths=[20, 0, 11], pool_rows=64, sink=sink)
  main = (batch.kv, batch.kv_rope, batch.kv_indptr, batch.kv_indices)
  kv, kv_rope, indptr, indices = make_source(rng, [3, 9, 0], pool_rows=32)
  if case == "plus_inf_sink":
    out, lse = decode_sources(backend, batch.q, batch.q_rope, [main, (kv, kv_rope, indptr,
                                                                    indices)], sink, 1)
    assert not out.any()
    np.testing.assert_array_equal(lse, np.full_like(lse, np.inf))
  elif case == "nan_in_extra":
    clean = decode_sources(backend, batch.q, batch.q_rope, [main, (kv, kv_rope, indptr, indices)],
                           sink, 1)
    kv = kv.copy()
    kv[indices[indptr[1] + 4], 448 + 2 * 2] = 0xFF  # a NaN scale in a row sequence 1 uses
    out, lse = decode_sources(backend, batch.q, batch.q_rope, [main, (kv, kv_rope, indptr,
                                                                    indices)], sink, 1)
    assert np.isnan(out[1]).all() and np.isnan(lse[1]).all()
    assert_bit_identical("out", out[[0, 2]], clean[0][[0, 2]], what="the sequences without NaN")
  else:
    given = [main, (kv, kv_rope, indptr, indices)]
    out, lse = decode_sources(backend, batch.q, batch.q_rope, given, sink, 1, return_lse=False)
    assert lse is None
    assert np.isfinite(out).all()
    assert_bf16_decode_close(out, None, *oracle_for(backend, batch.q, batch.q_rope, given, sink,
                                                    1))


@pytest.mark.parametrize("num_heads,tokens_per_seq,per_token", [
    (16, 4, "main"), (16, 4, "extra"), (16, 4, "both"), (64, 2, "main"), (128, 2, "both")])
def test_lists_per_query_token(backend, num_heads, tokens_per_seq, per_token):
  """A list per query token (kv_indptr [T + 1], MTP): each token attends to its own entries;
  a shared list beside it is repeated for every token of its sequence."""
  if not served(backend, num_heads, 1):
    pytest.skip(f"{backend} does not serve ({num_heads}, 1)")
  rng = np.random.default_rng(num_heads * tokens_per_seq)
  num_seqs = 3
  token_lengths = rng.integers(0, 90, size=num_seqs * tokens_per_seq)
  token_lengths[1] = 0
  seq_lengths = [40, 0, 7]
  main = make_source(rng, token_lengths if per_token in ("main", "both") else seq_lengths,
                     pool_rows=128)
  extra = make_source(rng, token_lengths[::-1] if per_token in ("extra", "both") else seq_lengths,
                      pool_rows=64)
  batch = make_batch(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq,
                     lengths=[1] * num_seqs, sink=rng.normal(size=num_heads).astype(np.float32))
  out, lse = decode_sources(backend, batch.q, batch.q_rope, [main, extra], batch.sink,
                            tokens_per_seq)
  check_finite_and_close(out, lse, oracle_for(backend, batch.q, batch.q_rope, [main, extra],
                                              batch.sink, tokens_per_seq))


@pytest.mark.parametrize("q_dtype", ["packed", "bfloat16", "float32"])
@pytest.mark.parametrize("softmax_scale", [None, 1.0, 2 * KERNEL_SCALE])
def test_model_queries_and_softmax_scale(backend, q_dtype, softmax_scale):
  """Q as the model holds it and any softmax scale: equal to the oracle on the inputs the
  backend computes with (the documented packing and folding), and within the fp8 packing's
  error of the exact oracle. A scale a power of two from 1/sqrt(512) folds exactly."""
  rng = np.random.default_rng(31)
  batch = make_batch(rng, num_heads=64, lengths=[60, 0, 200], pool_rows=128, sink=0.25)
  values = (rng.standard_normal((3, 64, 512)) * 0.05).astype(np.float32)
  if softmax_scale == 1.0:
    values *= KERNEL_SCALE  # MaxText folds head_dim ** -0.5 into Q and runs the softmax at 1
  if q_dtype == "packed":
    q, q_rope = map(np.asarray, jax_mla.pack_rows(jnp.asarray(values)))
  else:
    q, q_rope = values.astype(jnp.dtype(q_dtype)), None
  main = (batch.kv, batch.kv_rope, batch.kv_indptr, batch.kv_indices)
  out, lse = decode_sources(backend, q, q_rope, [main], batch.sink, 1,
                            softmax_scale=softmax_scale)
  check_finite_and_close(out, lse, oracle_for(backend, q, q_rope, [main], batch.sink, 1,
                                              softmax_scale))
  exact_out, exact_lse = oracle_for(backend, q, q_rope, [main], batch.sink, 1, softmax_scale,
                                    exact=True)
  # fp8 e4m3 keeps 3 mantissa bits: a packed Q moves each score by a few percent at most.
  assert_close("out vs exact", out, exact_out, atol=np.abs(exact_out).max() * 0.1, rtol=0.05,
               cos_tol=2e-3)
  assert_close("lse vs exact", lse, exact_lse, atol=0.05, rtol=0.01, cos_tol=None)
  if q_dtype == "packed" and softmax_scale == 2 * KERNEL_SCALE:  # a power-of-two fold is exact
    assert_bf16_decode_close(out, lse, exact_out, exact_lse)


@pytest.mark.parametrize("which", ["main", "extra", "both"])
def test_unquantized_pools(backend, which):
  """bf16 pools with kv_rope None (the window and heavily compressed caches as servers keep
  them): read as they are where the backend can, else only the rows used are packed."""
  rng = np.random.default_rng(41)
  batch = make_batch(rng, num_heads=16, tokens_per_seq=4, lengths=[50, 0, 9], pool_rows=128,
                     sink=-0.5)
  main = make_source(rng, [50, 0, 9], pool_rows=200,
                     form="bf16" if which in ("main", "both") else "packed")
  extra = make_source(rng, [0, 0, 33], pool_rows=40,
                      form="bf16" if which in ("extra", "both") else "packed")
  out, lse = decode_sources(backend, batch.q, batch.q_rope, [main, extra], batch.sink, 4)
  check_finite_and_close(out, lse, oracle_for(backend, batch.q, batch.q_rope, [main, extra],
                                              batch.sink, 4))
  exact_out, _ = oracle_for(backend, batch.q, batch.q_rope, [main, extra], batch.sink, 4,
                            exact=True)
  assert_close("out vs exact", out, exact_out, atol=np.abs(exact_out).max() * 0.1, rtol=0.05,
               cos_tol=2e-3)


def test_the_persistent_api_takes_model_inputs(backend):
  """decode_persistent with bf16 Q, a bf16 pool and a softmax scale (folded into Q before
  packing on every backend: the nm_ps kernel's scale is fixed) equals decode's contract."""
  heads = layouts(backend, persistent=True)[0][0]
  rng = np.random.default_rng(51)
  q = (rng.standard_normal((3, heads, 512)) * 0.05).astype(jnp.bfloat16)
  kv, _, indptr, indices = make_source(rng, [30, 0, 5], pool_rows=64, form="bf16")
  sink = np.full(heads, 0.5, np.float32)
  workspace = jax_mla.make_workspace(num_partitions=8, max_rows=3)
  out, lse, _ = jax_mla.decode_persistent(q, None, kv, None, indptr, indices, sink, workspace,
                                          softmax_scale=2 * KERNEL_SCALE, backend=backend)
  out, lse = _values(out), np.asarray(lse)
  packed_q = jax_mla.pack_rows(jnp.asarray(q, jnp.float32) * 2)
  packed_kv = jax_mla.pack_rows(jnp.asarray(kv))
  keys = token_keys(dequantize_rows(*map(np.asarray, packed_kv)), indptr, indices, 3, 1)
  check_finite_and_close(out, lse, oracle_attend(dequantize_rows(*map(np.asarray, packed_q)),
                                                 keys, sink, KERNEL_SCALE))
