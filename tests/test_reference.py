"""The reference decode against the independent float64 oracle, and its contracts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mla
from support.compare import assert_bf16_decode_close
from support.oracle import oracle_decode
from support.rows import POISON_PATTERNS, make_batch, poison_padding

SINKS = {"none": None, "neg_inf": -np.inf, "finite": 0.75, "large": 60.0, "pos_inf": np.inf}


def check_against_oracle(batch, out, lse):
  out = np.asarray(jnp.asarray(out, jnp.float32))
  assert_bf16_decode_close(out, np.asarray(lse),
                           *oracle_decode(*batch.args(), batch.tokens_per_seq))


@pytest.mark.parametrize("num_heads", [16, 32, 64, 128])
@pytest.mark.parametrize("tokens_per_seq", [1, 2, 4])
def test_matches_oracle_over_heads_and_tokens(num_heads, tokens_per_seq):
  rng = np.random.default_rng(num_heads * 10 + tokens_per_seq)
  batch = make_batch(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq,
                     lengths=[5, 0, 300, 1], sink=0.3, extra_indices=7)
  out, lse = jax.jit(lambda *a: jax_mla.decode(*a, tokens_per_seq=tokens_per_seq,
                                               backend="reference"))(*batch.args())
  check_against_oracle(batch, out, lse)


@pytest.mark.parametrize("sink", list(SINKS), ids=list(SINKS))
@pytest.mark.parametrize("pattern", ["random", "unique", "reversed", "same", "last"])
def test_sinks_and_index_patterns(sink, pattern):
  rng = np.random.default_rng(len(pattern) * 7 + len(sink))
  batch = make_batch(rng, num_heads=16, lengths=[0, 33, 257, 2], sink=SINKS[sink],
                     index_pattern=pattern)
  out, lse = jax_mla.decode(*batch.args(), backend="reference")
  check_against_oracle(batch, out, lse)


def test_per_head_sinks_and_empty_rows():
  rng = np.random.default_rng(5)
  sink = np.array([-np.inf, 0.0, 5.0, np.inf] * 4, np.float32)
  batch = make_batch(rng, num_heads=16, lengths=[0, 40, 0], sink=sink)
  out, lse = jax_mla.decode(*batch.args(), backend="reference")
  out = np.asarray(out, np.float32)
  lse = np.asarray(lse)
  for t in (0, 2):  # empty sequences: out = 0 and lse = sink
    assert not out[t].any()
    np.testing.assert_array_equal(lse[t], sink)
  assert not out[1, 3::4].any() and np.all(lse[1, 3::4] == np.inf)  # +inf sink: zeros
  check_against_oracle(batch, out, lse)


def test_no_sink_empty_row_gives_minus_inf_lse():
  batch = make_batch(np.random.default_rng(6), num_heads=16, lengths=[0, 4])
  out, lse = jax_mla.decode(*batch.args(), backend="reference")
  assert not np.asarray(out, np.float32)[0].any()
  assert np.all(np.asarray(lse)[0] == -np.inf)


@pytest.mark.parametrize("which", ["q", "kv", "both"])
@pytest.mark.parametrize("pattern", POISON_PATTERNS)
def test_padding_poison_leaves_results_bit_identical(which, pattern):
  rng = np.random.default_rng(7)
  batch = make_batch(rng, num_heads=32, lengths=[12, 0, 70], sink=0.5)
  clean = jax_mla.decode(*batch.args(), backend="reference")
  if which in ("q", "both"):
    batch.q = poison_padding(batch.q, pattern, rng)
  if which in ("kv", "both"):
    batch.kv = poison_padding(batch.kv, pattern, rng)
  dirty = jax_mla.decode(*batch.args(), backend="reference")
  assert np.isfinite(np.asarray(dirty[0], np.float32)).all()
  np.testing.assert_array_equal(np.asarray(dirty[0], np.float32), np.asarray(clean[0], np.float32))
  np.testing.assert_array_equal(np.asarray(dirty[1]), np.asarray(clean[1]))


def test_nan_rows_outside_the_index_lists_never_leak():
  """Pool rows nobody indexes hold NaN scales; masked chunk slots must not read them into sums."""
  rng = np.random.default_rng(8)
  batch = make_batch(rng, num_heads=16, lengths=[3, 300], pool_rows=512, sink=0.1)
  batch.poison_unindexed_rows()
  out, lse = jax_mla.decode(*batch.args(), backend="reference")
  assert np.isfinite(np.asarray(out, np.float32)).all() and np.isfinite(np.asarray(lse)).all()
  check_against_oracle(batch, out, lse)


def test_jit_and_eager_agree_and_lengths_do_not_recompile():
  rng = np.random.default_rng(9)
  traces = []

  def f(*args):
    traces.append(1)
    return jax_mla.decode(*args, backend="reference")

  jitted = jax.jit(f)
  first = make_batch(rng, num_heads=16, lengths=[10, 20, 30])
  out_j, lse_j = jitted(*first.args())
  out_e, lse_e = jax_mla.decode(*first.args(), backend="reference")
  np.testing.assert_array_equal(np.asarray(out_j, np.float32), np.asarray(out_e, np.float32))
  np.testing.assert_array_equal(np.asarray(lse_j), np.asarray(lse_e))
  for lengths in ([0, 0, 60], [59, 1, 0], [1, 2, 57]):  # same total, so same index-buffer shape
    batch = make_batch(rng, num_heads=16, lengths=lengths)
    out, lse = jitted(*batch.args())
    check_against_oracle(batch, out, lse)
  assert len(traces) == 1


def test_return_lse_false():
  batch = make_batch(np.random.default_rng(10), num_heads=16, lengths=[3])
  out, lse = jax_mla.decode(*batch.args(), backend="reference", return_lse=False)
  assert lse is None and out.shape == (1, 16, 512)


def test_long_rows_stay_bounded_in_memory():
  """A chunked walk: 64 x 128 heads x 2048 entries compiles to temporaries far below the
  [T, H, K, 512] (16 GiB) a naive gather would need."""
  rng = np.random.default_rng(11)
  batch = make_batch(rng, num_heads=128, lengths=[2048] * 64, pool_rows=4096)
  args = [jnp.asarray(a) for a in batch.args()[:-1]]
  compiled = jax.jit(lambda *a: jax_mla.decode(*a, backend="reference")).lower(*args).compile()
  memory = compiled.memory_analysis()
  if memory is None:
    pytest.skip("this jaxlib reports no memory analysis")
  assert memory.temp_size_in_bytes < 512 * 2**20, memory.temp_size_in_bytes
