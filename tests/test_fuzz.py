"""Generated cases (hypothesis) against the float64 oracle, on every path that runs on the CPU.

Over 1,000 cases per run (1,150: `QUOTAS`, each path's test checks that its own quota ran),
spread over the paths:
the reference, the host split path at planned and forced split counts with its default and its
fp32 kernels, the host persistent path at several partition counts, and the Pallas Triton kernel
in interpret mode. A case is a ragged batch with random lengths (empty and one-entry sequences
included), index patterns, sinks (finite, large, -inf, +inf, per head), a NaN in a used KV row or
a query row, NaN in pool rows nobody indexes, and poisoned padding bytes; the result must match
the oracle's non-finite pattern first, then its values (support.compare.assert_close).

Cheap by construction. Every case of a path has one of a few static shapes (`BUCKETS`: sequences,
index capacity, pool rows), so each (path, options, shape) compiles once and serves all its cases
(`jitted` keeps the functions); the lengths, indices, values, sinks and NaNs are data. The fuzz
takes about three minutes on the 2-core development machine (all three input kinds).

Structure, for a new input form: `draw_case` draws the common part (layout, lengths, sinks,
NaN and poison plans, seed); an input kind (`INPUT_KINDS`) turns it into the call's arguments and
the oracle's values (queries and each query token's keys). Kinds: "packed" (fp8 Q, one packed
pool); "two_sources" (a second packed pool through `extra=`, its lists shared or one per query
token); "model_values" (bf16 Q and a bf16 pool with `q_rope=None` / `kv_rope=None`, values fp8
holds exactly, so every backend's documented form of them, as given or packed, is the same
values; and a softmax scale twice the kernels', which folds into Q exactly).

NaN precedence: where a head's scores hold a NaN (a NaN in a used KV row or in its query row),
its out and lse are NaN whatever the sink, +inf included (docs/contracts.md: "that sequence's
out and lse are NaN"; support.oracle alone would give out 0, lse +inf there).

JAX_MLA_FUZZ_SCALE=k multiplies every path's case count; JAX_MLA_FUZZ_RANDOM=1 draws new cases
instead of CI's fixed (derandomized) ones.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jax_mla
from jax_mla._src import backends
from jax_mla._src.pallas import backend as pallas_backend
from support.compare import assert_close
from support.oracle import dequantize_rows, oracle_attend, token_keys
from support.rows import POISON_PATTERNS, make_batch, make_source, poison_padding

SCALE = 1.0 / math.sqrt(512.0)
FUZZ_SCALE = float(os.environ.get("JAX_MLA_FUZZ_SCALE", "1"))
MIN_CASES = 1000  # per run, at scale 1

# Static shapes: (sequences, kv_indices capacity, pool rows, longest list). A case's lengths sum
# to at most the capacity; the entries past them are junk the kernels must not read.
BUCKETS = {"small": (3, 400, 96, 130), "many": (9, 640, 96, 70)}
LAYOUTS = [(16, 1), (16, 2), (16, 4), (32, 1), (64, 1), (128, 1), (8, 1)]  # the kernels' (and 8)
ODD_LAYOUTS = [(1, 1), (3, 2), (24, 3)]  # the reference serves any
SINKS = [-np.inf, np.inf, 0.0, -3.5, 2.25, 80.0, -80.0]
NAN_PLANS = ["none", "none", "kv_fp8", "kv_scale", "kv_rope", "q", "unused_rows"]
INDEX_PATTERNS = ["random", "unique", "reversed", "same", "last"]


@dataclasses.dataclass
class Draw:
  """The common part of a case, before an input kind gives it its form."""
  num_heads: int
  tokens_per_seq: int
  bucket: str
  lengths: list
  sink: np.ndarray  # f32 [H]; -inf: no sink
  nan: str
  poison: str  # none / q / kv / both
  poison_pattern: str
  index_pattern: str
  seed: int


@dataclasses.dataclass
class Inputs:
  """One case in the form a kind gives it: the API's arguments and the oracle's values."""
  args: tuple  # (q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink)
  kwargs: dict  # array keyword arguments (e.g. extra=KVSource(...))
  queries: np.ndarray  # float64 [T, H, 512]
  keys: list  # float64 [K_t, 512] per query token
  options: dict = dataclasses.field(default_factory=dict)  # static keywords (softmax_scale)
  scale: float = SCALE


def packed_inputs(d: Draw) -> Inputs:
  """Packed fp8 Q and one packed pool (make_batch), with the draw's NaNs and poison."""
  rng = np.random.default_rng(d.seed)
  num_seqs, capacity, pool_rows, _ = BUCKETS[d.bucket]
  batch = make_batch(rng, num_heads=d.num_heads, tokens_per_seq=d.tokens_per_seq,
                     lengths=d.lengths, pool_rows=pool_rows, sink=d.sink,
                     index_pattern=d.index_pattern,
                     extra_indices=capacity - int(sum(d.lengths)))
  used = batch.kv_indices[:batch.kv_indptr[-1]]
  if d.nan == "unused_rows":  # NaN scales in every row no list uses; the junk entries point there
    unused = np.flatnonzero(~np.isin(np.arange(pool_rows), used))
    batch.kv[unused, 448:462] = 0xFF
    if unused.size:
      batch.kv_indices[batch.kv_indptr[-1]:] = np.resize(unused, capacity - batch.kv_indptr[-1])
  elif d.nan.startswith("kv") and used.size:
    row = used[rng.integers(used.size)]
    if d.nan == "kv_fp8":
      batch.kv[row, rng.integers(448)] = rng.choice([0x7F, 0xFF])
    elif d.nan == "kv_scale":
      batch.kv[row, 448 + 2 * rng.integers(7)] = 0xFF
    else:
      batch.kv_rope[row, rng.integers(64)] = np.float32("nan")
  elif d.nan == "q":
    batch.q[rng.integers(batch.q.shape[0]), rng.integers(d.num_heads), rng.integers(448)] = 0x7F
  if d.poison in ("q", "both"):
    batch.q = poison_padding(batch.q, d.poison_pattern, rng)
  if d.poison in ("kv", "both"):
    batch.kv = poison_padding(batch.kv, d.poison_pattern, rng)
  num_tokens = batch.q.shape[0]
  pool = dequantize_rows(batch.kv, batch.kv_rope)
  return Inputs(args=batch.args(), kwargs={}, queries=dequantize_rows(batch.q, batch.q_rope),
                keys=token_keys(pool, batch.kv_indptr, batch.kv_indices, num_tokens,
                                d.tokens_per_seq))


EXTRA_POOL_ROWS = 48


def two_source_inputs(d: Draw) -> Inputs:
  """"packed" plus a second packed pool (`extra=`): random lengths (empty ones included), its
  lists shared by a sequence's tokens or (with several tokens) one per query token, its own
  padding poisoned like the first pool's."""
  inputs = packed_inputs(d)
  rng = np.random.default_rng(d.seed + 1)
  num_seqs, capacity, _, _ = BUCKETS[d.bucket]
  num_tokens = inputs.queries.shape[0]
  per_token = d.tokens_per_seq > 1 and bool(rng.integers(2))
  lists = num_tokens if per_token else num_seqs
  width = capacity // 2  # one index-list length per (bucket, form): one compilation
  lengths = np.minimum(rng.choice([0, 1, 5, 17, 40], size=lists), width // lists)
  kv, kv_rope, indptr, indices = make_source(rng, lengths, pool_rows=EXTRA_POOL_ROWS,
                                             extra_indices=width - int(lengths.sum()))
  if d.poison in ("kv", "both"):
    kv = poison_padding(kv, d.poison_pattern, rng)
  extra_keys = token_keys(dequantize_rows(kv, kv_rope), indptr, indices, num_tokens,
                          d.tokens_per_seq)
  return dataclasses.replace(
      inputs, kwargs={"extra": jax_mla.KVSource(kv, kv_rope, indptr, indices)},
      keys=[np.concatenate([a, b]) for a, b in zip(inputs.keys, extra_keys)])


def model_value_inputs(d: Draw) -> Inputs:
  """"packed"'s values given as a model holds them: bf16 Q and a bf16 pool (exact: fp8 values
  times power-of-two scales fit bf16, and pack_rows gives back the same fp8 values), with
  softmax_scale twice the kernels' (a power-of-two fold)."""
  inputs = packed_inputs(d)
  _, _, kv, kv_rope, indptr, indices, sink = inputs.args
  q_values = inputs.queries.astype(ml_dtypes.bfloat16)
  kv_values = dequantize_rows(kv, kv_rope).astype(ml_dtypes.bfloat16)
  return dataclasses.replace(inputs, args=(q_values, None, kv_values, None, indptr, indices, sink),
                             options={"softmax_scale": 2 * SCALE}, scale=2 * SCALE)


INPUT_KINDS = {"packed": packed_inputs, "two_sources": two_source_inputs,
               "model_values": model_value_inputs}
# decode_persistent takes one source.
PERSISTENT_KINDS = ("packed", "model_values")


def expected(inputs: Inputs, sink):
  """The oracle's (out, lse), with NaN precedence (module docstring)."""
  out, lse = oracle_attend(inputs.queries, inputs.keys, sink, inputs.scale)
  for t, keys in enumerate(inputs.keys):
    with np.errstate(invalid="ignore"):
      nan_heads = np.isnan(inputs.queries[t] @ np.asarray(keys).T).any(axis=1)
    out[t, nan_heads], lse[t, nan_heads] = np.nan, np.nan
  return out, lse


@st.composite
def draws(draw, layouts, buckets=("small",)):
  num_heads, tokens_per_seq = draw(st.sampled_from(layouts))
  bucket = draw(st.sampled_from(buckets))
  num_seqs, capacity, _, longest = BUCKETS[bucket]
  lengths = draw(st.lists(st.one_of(st.just(0), st.just(1), st.integers(2, 33),
                                    st.integers(34, longest)),
                          min_size=num_seqs, max_size=num_seqs))
  while sum(lengths) > capacity:
    lengths[lengths.index(max(lengths))] //= 2
  sink_form = draw(st.sampled_from(["none", "one", "per_head"]))
  if sink_form == "none":
    sink = np.full(num_heads, -np.inf, np.float32)
  elif sink_form == "one":
    sink = np.full(num_heads, draw(st.sampled_from(SINKS)), np.float32)
  else:
    sink = np.asarray(draw(st.lists(st.sampled_from(SINKS), min_size=num_heads,
                                    max_size=num_heads)), np.float32)
  return Draw(num_heads=num_heads, tokens_per_seq=tokens_per_seq, bucket=bucket, lengths=lengths,
              sink=sink, nan=draw(st.sampled_from(NAN_PLANS)),
              poison=draw(st.sampled_from(["none", "q", "kv", "both"])),
              poison_pattern=draw(st.sampled_from(POISON_PATTERNS)),
              index_pattern=draw(st.sampled_from(INDEX_PATTERNS)),
              seed=draw(st.integers(0, 2**31 - 1)))


def check(out, lse, want_out, want_lse):
  out = np.asarray(jnp.asarray(out, jnp.float32))
  scale = max(np.abs(want_out[np.isfinite(want_out)]).max(initial=0.0), 1e-30)
  assert_close("out", out, want_out, atol=scale * 2.0**-7, rtol=2.0**-8, cos_tol=1e-5)
  if lse is not None:
    finite = want_lse[np.isfinite(want_lse)]
    assert_close("lse", np.asarray(lse), want_lse,
                 atol=2e-4 * max(1.0, np.abs(finite).max(initial=1.0)), rtol=1e-5, cos_tol=None)


@functools.lru_cache(maxsize=None)
def jitted(api: str, **options):
  """One jitted function per path and static options; jit keeps one executable per shape."""
  if api == "decode":
    return jax.jit(lambda args, kwargs: jax_mla.decode(*args, **kwargs, **options))
  return jax.jit(lambda args, kwargs, ws: jax_mla.decode_persistent(*args, ws, **kwargs,
                                                                    **options))


CASES = collections.Counter()  # cases run, per test


def run_decode(name, d: Draw, kind: str, **options):
  inputs = INPUT_KINDS[kind](d)
  out, lse = jitted("decode", tokens_per_seq=d.tokens_per_seq, **inputs.options, **options)(
      inputs.args, inputs.kwargs)
  check(out, lse, *expected(inputs, d.sink))
  CASES[name] += 1


FUZZ = settings(max_examples=1, deadline=None,
                derandomize=os.environ.get("JAX_MLA_FUZZ_RANDOM") != "1", database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much,
                                       HealthCheck.function_scoped_fixture])


def examples(n: int) -> settings:
  return settings(FUZZ, max_examples=max(1, round(n * FUZZ_SCALE)))


@pytest.fixture
def monkeypatch_env(monkeypatch):
  """set(name, value): the variable for the rest of the test ("default": unset)."""
  def set_variable(name, value):
    if value == "default":
      monkeypatch.delenv(name, raising=False)
    else:
      monkeypatch.setenv(name, value)
  return set_variable


needs_host = pytest.mark.skipif(not backends.host_available()[0],
                                reason=f"no host backend: {backends.host_available()[1]}")
kinds = st.sampled_from(sorted(INPUT_KINDS))


# --- the paths ---------------------------------------------------------------------------------

# Cases per path, per run at scale 1. Each path's test checks that its own quota ran (a count
# per test, so it holds in whichever pytest-xdist worker runs the test).
QUOTAS = {"reference": 240, "host": 360, "host_fp32": 170, "host_persistent": 220,
          "pallas_interpret": 160}


def run_quota(name, cases):
  """Runs `cases` (a @given function of no fixtures) and checks it ran the path's quota."""
  before = CASES[name]
  cases()
  ran, want = CASES[name] - before, max(1, round(QUOTAS[name] * FUZZ_SCALE))
  assert ran >= want, f"{name}: {ran} generated cases ran, fewer than its quota of {want}"


def test_quotas_add_up_to_the_minimum():
  assert sum(QUOTAS.values()) >= MIN_CASES


def test_reference():
  @examples(QUOTAS["reference"])
  @given(draws(LAYOUTS + ODD_LAYOUTS), kinds, st.booleans())
  def cases(d, kind, return_lse):
    run_decode("reference", d, kind, backend="reference", return_lse=return_lse)
  run_quota("reference", cases)


def host_split_case(name, d, kind, splits):
  """splits: None (the CPU's plan), a count, or one split (the kernel's direct bf16 output)
  with the LSE the executor adds, or without an LSE."""
  if splits == "one split, no lse":
    run_decode(name, d, kind, backend="host", num_kv_splits=1, return_lse=False)
  else:
    run_decode(name, d, kind, backend="host", num_kv_splits=1 if splits == "one split" else splits)


@needs_host
def test_host_split():
  """The host split path with its default kernels (AVX512-BF16 where the CPU has them)."""
  @examples(QUOTAS["host"])
  @given(draws(LAYOUTS, buckets=tuple(BUCKETS)), kinds,
         st.sampled_from([None, None, 2, 3, 16, "one split", "one split, no lse"]))
  def cases(d, kind, splits):
    host_split_case("host", d, kind, splits)
  run_quota("host", cases)


@needs_host
def test_host_split_fp32_kernels(monkeypatch_env):
  """The same path with the fp32 kernels, which CPUs without AVX512-BF16 run."""
  monkeypatch_env("JAX_MLA_HOST_KERNELS", "fp32")

  @examples(QUOTAS["host_fp32"])
  @given(draws(LAYOUTS, buckets=tuple(BUCKETS)), kinds,
         st.sampled_from([None, 3, "one split", "one split, no lse"]))
  def cases(d, kind, splits):
    host_split_case("host_fp32", d, kind, splits)
  run_quota("host_fp32", cases)


# One workspace per partition count, reused by every case: a call that left its arrival counters
# dirty would corrupt the next case.
_WORKSPACES = {}
PERSISTENT_PARTITIONS = [1, 3, 16, 128]


@needs_host
def test_host_persistent(monkeypatch_env):
  @examples(QUOTAS["host_persistent"])
  @given(draws([(128, 1)], buckets=tuple(BUCKETS)), st.sampled_from(PERSISTENT_KINDS),
         st.sampled_from(PERSISTENT_PARTITIONS),
         st.booleans(), st.sampled_from(["default", "fp32"]))
  def cases(d, kind, num_partitions, return_lse, kernels):
    monkeypatch_env("JAX_MLA_HOST_KERNELS", kernels)
    inputs = INPUT_KINDS[kind](d)
    max_rows = max(b[0] for b in BUCKETS.values())
    ws = _WORKSPACES.get(num_partitions)
    if ws is None:
      ws = jax_mla.make_workspace(num_partitions, max_rows, allow_any_partitions=True)
    out, lse, ws = jitted("persistent", backend="host", return_lse=return_lse,
                          **inputs.options)(inputs.args, inputs.kwargs, ws)
    _WORKSPACES[num_partitions] = ws
    assert not np.asarray(ws.cnt).any(), "arrival counters not back at zero"
    check(out, lse, *expected(inputs, d.sink))
    CASES["host_persistent"] += 1
  run_quota("host_persistent", cases)


@pytest.fixture
def pallas_interpret(monkeypatch):
  if jax.default_backend() != "cpu":
    pytest.skip("interpret mode stands in for the GPU on CPU machines only")
  monkeypatch.setattr(pallas_backend, "device_kernel", lambda: ("triton", "interpret mode"))
  monkeypatch.setattr(pallas_backend, "_interpret", lambda: True)


def test_pallas_triton_interpret(pallas_interpret):
  del pallas_interpret  # in effect for the test

  @examples(QUOTAS["pallas_interpret"])
  @given(draws(LAYOUTS), kinds, st.booleans())
  def cases(d, kind, return_lse):
    run_decode("pallas_interpret", d, kind, backend="pallas", return_lse=return_lse)
  run_quota("pallas_interpret", cases)
