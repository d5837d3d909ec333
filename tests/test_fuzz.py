"""Property-based tests: generated shapes, lengths, index patterns, sinks and padding poison.

Every backend available on this machine agrees with the float64 oracle, and results are finite
wherever the oracle's are (compare.assert_close matches the non-finite pattern before any
tolerance): the reference, the host split path at generated split counts, and the host persistent
path at generated partition counts, one workspace reused across examples. Run with
`--hypothesis-show-statistics` to see how many cases were generated.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jax_mla
from jax_mla._src import backends
from support.compare import assert_close
from support.oracle import oracle_decode
from support.rows import POISON_PATTERNS, make_batch, poison_padding

KERNEL_SHAPES = [(16, 1), (16, 2), (16, 4), (32, 1), (64, 1), (128, 1), (8, 1)]
INDEX_PATTERNS = ["random", "unique", "reversed", "same", "last"]
SINK_VALUES = [None, -np.inf, 0.0, -3.5, 2.25, 80.0, np.inf]


@st.composite
def decode_problems(draw, shapes):
  num_heads, tokens_per_seq = draw(st.sampled_from(shapes))
  lengths = draw(st.lists(st.one_of(st.just(0), st.integers(1, 40), st.integers(41, 300)),
                          min_size=1, max_size=4))
  seed = draw(st.integers(0, 2**31 - 1))
  pool_rows = draw(st.sampled_from([1, 7, 64, 1000]))
  sink = draw(st.sampled_from(SINK_VALUES))
  per_head = draw(st.booleans())
  rng = np.random.default_rng(seed)
  if sink is not None and per_head:
    sink = rng.choice(np.array([s for s in SINK_VALUES if s is not None], np.float32),
                      size=num_heads)
  batch = make_batch(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq, lengths=lengths,
                     pool_rows=pool_rows, sink=sink,
                     index_pattern=draw(st.sampled_from(INDEX_PATTERNS)),
                     extra_indices=draw(st.integers(0, 5)))
  which = draw(st.sampled_from(["none", "q", "kv", "both"]))
  pattern = draw(st.sampled_from(POISON_PATTERNS))
  if which in ("q", "both"):
    batch.q = poison_padding(batch.q, pattern, rng)
  if which in ("kv", "both"):
    batch.kv = poison_padding(batch.kv, pattern, rng)
  splits = draw(st.sampled_from([None, 1, 2, 3, 5, 16]))
  return batch, splits


def check(batch, out, lse, sink=None):
  args = batch.args() if sink is None else batch.args()[:6] + (sink,)
  want_out, want_lse = oracle_decode(*args, batch.tokens_per_seq)
  out = np.asarray(jnp.asarray(out, jnp.float32))
  scale = max(np.abs(want_out).max(initial=0.0), 1e-30)
  assert_close("out", out, want_out, atol=scale * 2.0**-7, rtol=2.0**-8, cos_tol=1e-5)
  if lse is None:
    return
  finite = want_lse[np.isfinite(want_lse)]
  assert_close("lse", np.asarray(lse), want_lse,
               atol=2e-4 * max(1.0, np.abs(finite).max(initial=1.0)), rtol=1e-5, cos_tol=None)


FUZZ = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(decode_problems([(h, m) for h in (1, 3, 16, 24) for m in (1, 2, 3)] + KERNEL_SHAPES))
def test_reference_agrees_with_oracle(problem):
  batch, _ = problem
  out, lse = jax_mla.decode(*batch.args(), tokens_per_seq=batch.tokens_per_seq,
                            backend="reference")
  check(batch, out, lse)


needs_host = pytest.mark.skipif(not backends.host_available()[0],
                                reason=f"no host backend: {backends.host_available()[1]}")


@needs_host
@settings(FUZZ, max_examples=40)
@given(decode_problems(KERNEL_SHAPES), st.booleans())
def test_host_split_agrees_with_oracle(problem, return_lse):
  batch, splits = problem
  if splits == 1 and return_lse:  # one split writes no LSE: refused, by contract
    with pytest.raises(ValueError, match="num_kv_splits=1 with return_lse=True"):
      jax_mla.decode(*batch.args(), tokens_per_seq=batch.tokens_per_seq, num_kv_splits=1,
                     backend="host")
    return_lse = False
  out, lse = jax_mla.decode(*batch.args(), tokens_per_seq=batch.tokens_per_seq,
                            num_kv_splits=splits, backend="host", return_lse=return_lse)
  assert (lse is None) == (not return_lse)
  check(batch, out, lse)


# One workspace per partition count, reused by every example: a call that left its arrival
# counters dirty would corrupt the next example's result.
_WORKSPACES = {}
PERSISTENT_MAX_ROWS = 8


@st.composite
def persistent_problems(draw):
  batch, _ = draw(decode_problems([(128, 1)]))
  return batch, draw(st.sampled_from([1, 3, 8, 16, 64]))


@needs_host
@settings(FUZZ, max_examples=30)
@given(persistent_problems(), st.booleans())
def test_host_persistent_agrees_with_oracle(problem, return_lse):
  batch, num_partitions = problem
  assert len(batch.kv_indptr) - 1 <= PERSISTENT_MAX_ROWS
  ws = _WORKSPACES.get(num_partitions)
  if ws is None:
    ws = jax_mla.make_workspace(num_partitions, PERSISTENT_MAX_ROWS, allow_any_partitions=True)
  out, lse, ws = jax_mla.decode_persistent(*batch.args(), ws, backend="host",
                                           return_lse=return_lse)
  _WORKSPACES[num_partitions] = ws
  assert not np.asarray(ws.cnt).any(), "arrival counters not back at zero"
  sink = batch.sink if batch.sink is not None else np.full(128, -np.inf, np.float32)
  check(batch, out, lse, sink)
