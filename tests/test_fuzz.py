"""Property-based tests: generated shapes, lengths, index patterns, sinks and padding poison.

Every backend available on this machine agrees with the float64 oracle, and results are finite
wherever the oracle's are.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jax_mla
from compare import assert_close
from oracle import oracle_decode
from rows import POISON_PATTERNS, make_batch, poison_padding

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
  splits = draw(st.sampled_from([None, 2, 3, 5, 16]))
  return batch, splits


def check(batch, out, lse):
  want_out, want_lse = oracle_decode(*batch.args(), batch.tokens_per_seq)
  out = np.asarray(jnp.asarray(out, jnp.float32))
  scale = max(np.abs(want_out).max(initial=0.0), 1e-30)
  assert_close("out", out, want_out, atol=scale * 2.0**-7, rtol=2.0**-8, cos_tol=1e-5)
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
