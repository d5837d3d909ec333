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
refused with the reason.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mla
from jax_mla._src import backends
from jax_mla._src.pallas import backend as pallas_backend
from support.compare import assert_bf16_decode_close, assert_bit_identical
from support.oracle import oracle_decode
from support.rows import POISON_PATTERNS, make_batch, poison_padding


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


def decode(batch, backend, **kwargs):
  out, lse = jax_mla.decode(*batch.args(), tokens_per_seq=batch.tokens_per_seq, backend=backend,
                            **kwargs)
  return np.asarray(jnp.asarray(out, jnp.float32)), (None if lse is None else np.asarray(lse))


def run_api(batch, backend, api, **kwargs):
  """(out f32, lse) through `decode` (kwargs go to it) or `decode_persistent` (one token per
  row)."""
  if api == "decode":
    return decode(batch, backend, **kwargs)
  workspace = jax_mla.make_workspace(num_partitions=8, max_rows=batch.q.shape[0])
  out, lse, workspace = jax_mla.decode_persistent(*batch.args(), workspace, backend=backend)
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
@pytest.mark.parametrize("sink", ["none", "finite", "per_head"])
def test_sinks_and_empty_rows(backend, sink, api):
  num_heads = api_heads(backend, api, 64)
  sink = {"none": None, "finite": 1.5,
          "per_head": np.array([-np.inf, 0.0, 5.0, np.inf] * (num_heads // 4), np.float32)}[sink]
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
