"""Both gfx950 kernels against the float64 oracle over the grid of KERNELS.md section 6.

Marked gfx950: on anything but an MI355X with AMD's verified code objects they skip with the
reason (tests/conftest.py; the predicate fails closed, see test_platform.py).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import jax_mla
from gfx950_cases import check, persistent, sink_or_none, split
from support.rows import POISON_PATTERNS, make_batch, poison_padding

pytestmark = pytest.mark.gfx950

SHAPES = [(16, 1), (16, 2), (16, 4), (32, 1), (64, 1), (128, 1), (8, 1)]
RAGGED = [0, 1, 31, 32, 33, 300, 0, 2047, 8320]


@pytest.mark.parametrize("heads,msq", SHAPES)
@pytest.mark.parametrize("splits", [None, 1, 2, 5, 16])
def test_split_kernel_ragged_with_empty_rows(heads, msq, splits):
  batch = make_batch(np.random.default_rng(heads * 10 + msq), num_heads=heads,
                     tokens_per_seq=msq, lengths=RAGGED, pool_rows=20000, sink=0.5,
                     extra_indices=7)
  out, lse = split(batch, splits, return_lse=splits != 1)
  check(batch, out, lse, f"split H={heads} msq={msq} S={splits}")


@pytest.mark.parametrize("partitions", [8, 64, 128, 1024])
def test_persistent_kernel_ragged_with_empty_rows(partitions):
  batch = make_batch(np.random.default_rng(partitions), num_heads=128, lengths=RAGGED,
                     pool_rows=20000, sink=-1.0)
  out, lse, ws = persistent(batch, jax_mla.make_workspace(partitions, 64))
  check(batch, out, lse, f"persistent P={partitions}")
  assert not np.asarray(ws.cnt).any(), "arrival counters not back at zero"


@pytest.mark.parametrize("where", ["q", "kv", "both"])
@pytest.mark.parametrize("pattern", POISON_PATTERNS)
def test_padding_poison_is_bit_identical(where, pattern):
  rng = np.random.default_rng(7)
  batch = make_batch(rng, num_heads=128, lengths=[5, 0, 700, 64], pool_rows=1000, sink=0.25)
  clean = [split(batch, 4), persistent(batch, jax_mla.make_workspace(128, 8))[:2]]
  if where in ("q", "both"):
    batch.q = poison_padding(batch.q, pattern, rng)
  if where in ("kv", "both"):
    batch.kv = poison_padding(batch.kv, pattern, rng)
  dirty = [split(batch, 4), persistent(batch, jax_mla.make_workspace(128, 8))[:2]]
  for (o1, l1), (o2, l2) in zip(clean, dirty):
    np.testing.assert_array_equal(np.asarray(o1, np.float32), np.asarray(o2, np.float32))
    np.testing.assert_array_equal(np.asarray(l1), np.asarray(l2))


def test_many_rows_and_long_kv():
  # The float64 oracle is slow: most rows short, every 500th at the suites' longest K = 8320.
  lengths = np.random.default_rng(3).integers(0, 300, 3000)
  lengths[::17] = 0
  lengths[5::500] = 8320
  batch = make_batch(np.random.default_rng(4), num_heads=128, lengths=lengths, pool_rows=65536,
                     sink=1.0)
  check(batch, *split(batch), "split N=3000")
  out, lse, _ = persistent(batch, jax_mla.make_workspace(128, 3000))
  check(batch, out, lse, "persistent N=3000")


def test_n_32768_rows_persistent():
  n = 32768
  live = np.array([0, 1, 16383, n - 1])
  small = make_batch(np.random.default_rng(0), num_heads=128, lengths=[1, 5, 40, 3],
                     pool_rows=64, sink=0.5)
  k = np.zeros(n, np.int64)
  k[live] = [1, 5, 40, 3]
  kv_indptr = jnp.asarray(np.concatenate([[0], np.cumsum(k)]).astype(np.int32))

  @jax.jit
  def run(ws, q_live, q_rope_live, kv, kv_rope, kv_indices, sink):
    q = jnp.zeros((n, 128, 512), jnp.uint8).at[live].set(q_live)
    q_rope = jnp.zeros((n, 128, 64), jnp.bfloat16).at[live].set(q_rope_live)
    out, lse, ws = jax_mla.decode_persistent(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink,
                                             ws, backend="gfx950")
    return out[live], lse[live], out[2], ws

  out, lse, empty, ws = run(jax_mla.make_workspace(128), small.q, small.q_rope, small.kv,
                            small.kv_rope, small.kv_indices, small.sink)
  check(small, out, lse, "persistent N=32768")
  assert not np.asarray(empty, np.float32).any()
  assert not np.asarray(ws.cnt).any()


def test_kv_indptr_with_offset_and_extra_entries():
  rng = np.random.default_rng(12)
  batch = make_batch(rng, num_heads=128, lengths=[10, 0, 500], pool_rows=1000, extra_indices=9)
  batch.kv_indices = np.concatenate([rng.integers(0, 1000, 6), batch.kv_indices]).astype(np.int32)
  batch.kv_indptr = batch.kv_indptr + 6
  out, lse, _ = persistent(batch, jax_mla.make_workspace(128, 8))
  check(batch, out, lse, "persistent offset")


def test_workspace_reuse_across_batch_sizes():
  ws = jax_mla.make_workspace(128, 4096)
  for i, num_rows in enumerate([1, 64, 7, 3000, 2]):
    rng = np.random.default_rng(100 + i)
    batch = make_batch(rng, num_heads=128, lengths=rng.integers(0, 200, num_rows),
                       pool_rows=10000, sink=0.0)
    out, lse, ws = persistent(batch, ws)
    check(batch, out, lse, f"reuse N={num_rows}")
    assert not np.asarray(ws.cnt).any()


@pytest.mark.parametrize("lengths", [[1, 2, 3], [0, 4000, 31, 32, 33, 8320]])
def test_the_two_kernels_and_the_host_backend_agree(lengths):
  batch = make_batch(np.random.default_rng(9), num_heads=128, lengths=lengths, pool_rows=9000,
                     sink=0.1)
  a_out, a_lse = split(batch)
  b_out, b_lse, _ = persistent(batch, jax_mla.make_workspace(128, 8))
  h_out, h_lse = jax_mla.decode(*batch.args(), backend="host", num_kv_splits=4)
  scale = float(np.abs(np.asarray(h_out, np.float32)).max())
  for name, o, l in (("split", a_out, a_lse), ("persistent", b_out, b_lse)):
    o, ho = np.asarray(o, np.float32), np.asarray(h_out, np.float32)
    assert np.array_equal(np.isfinite(o), np.isfinite(ho)), name
    np.testing.assert_allclose(o, ho, atol=2e-2 * scale, rtol=2e-2, err_msg=name)
    np.testing.assert_allclose(np.asarray(l), np.asarray(h_lse), atol=1e-2, rtol=1e-3,
                               err_msg=name)


def test_scan_decode_loop_with_changing_lengths():
  steps, num_seqs = 6, 4
  rng = np.random.default_rng(21)
  base = make_batch(rng, num_heads=128, lengths=[0] * num_seqs, pool_rows=4096, sink=0.3)
  q = np.stack([make_batch(rng, num_heads=128, lengths=[1] * num_seqs, pool_rows=1).q
                for _ in range(steps)])
  q_rope = np.stack([base.q_rope] * steps)
  lengths = np.array([[0, 1, 40, 7], [1, 2, 41, 0], [2, 300, 42, 0], [33, 301, 0, 1],
                      [34, 302, 0, 2], [2047, 303, 1, 3]], np.int32)
  indices = rng.integers(0, 4096, (steps, int(lengths.sum(1).max()) + 3)).astype(np.int32)
  indptr = np.concatenate([np.zeros((steps, 1), np.int32), np.cumsum(lengths, 1)], 1)
  indptr = indptr.astype(np.int32)

  def step(ws, xs):
    q_t, q_rope_t, indptr_t, indices_t = xs
    o1, l1 = jax_mla.decode(q_t, q_rope_t, base.kv, base.kv_rope, indptr_t, indices_t,
                            base.sink, backend="gfx950")
    o2, l2, ws = jax_mla.decode_persistent(q_t, q_rope_t, base.kv, base.kv_rope, indptr_t,
                                           indices_t, base.sink, ws, backend="gfx950")
    return ws, (o1, l1, o2, l2)

  ws, (o1, l1, o2, l2) = jax.jit(lambda ws, *xs: jax.lax.scan(step, ws, xs))(
      jax_mla.make_workspace(128, num_seqs), q, q_rope, indptr, indices)
  for t in range(steps):
    batch = make_batch(rng, num_heads=128, lengths=[1], pool_rows=1)  # overwritten below
    batch.q, batch.q_rope, batch.kv, batch.kv_rope = q[t], q_rope[t], base.kv, base.kv_rope
    batch.kv_indptr, batch.kv_indices, batch.sink = indptr[t], indices[t], base.sink
    check(batch, o1[t], l1[t], f"scan split t={t}")
    check(batch, o2[t], l2[t], f"scan persistent t={t}")
  assert not np.asarray(ws.cnt).any()


def test_check_indices_keeps_the_kernels_in_bounds():
  batch = make_batch(np.random.default_rng(2), num_heads=128, lengths=[10, 20], pool_rows=32)
  batch.kv_indices[5] = 1 << 30  # far outside the pool: the kernel would fault on it
  f = jax.jit(checkify.checkify(
      lambda *a: jax_mla.decode(*a, backend="gfx950", check_indices=True),
      errors=checkify.user_checks))
  err, (out, _) = f(*batch.args())
  assert "kv_indices[5]" in err.get()
  assert not np.asarray(out, np.float32).any()
  g = jax.jit(checkify.checkify(
      lambda *a: jax_mla.decode_persistent(*a, backend="gfx950", check_indices=True),
      errors=checkify.user_checks))
  err, (out, _, ws) = g(*batch.args()[:6], sink_or_none(batch, 128),
                        jax_mla.make_workspace(128, 4))
  assert "kv_indices[5]" in err.get() and not np.asarray(ws.cnt).any()


def test_rows_past_4_gib():
  from test_large_pool import BIG_ROWS, NUM_ROWS  # pylint: disable=import-outside-toplevel
  batch = make_batch(np.random.default_rng(5), num_heads=128, lengths=[7, 0, 40, 1],
                     pool_rows=len(BIG_ROWS), sink=0.75)
  batch.kv_indices[:3] = [0, 0, 1]
  big_indices = BIG_ROWS[batch.kv_indices].astype(np.int32)

  @jax.jit
  def run(q, q_rope, small_kv, small_rope, kv_indptr, kv_indices, sink, ws):
    kv = jnp.zeros((NUM_ROWS, 512), jnp.uint8).at[BIG_ROWS].set(small_kv)
    kv_rope = jnp.zeros((NUM_ROWS, 64), jnp.bfloat16).at[BIG_ROWS].set(small_rope)
    args = (q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink)
    return (jax_mla.decode(*args, backend="gfx950", num_kv_splits=3),
            jax_mla.decode_persistent(*args, ws, backend="gfx950")[:2])

  split_result, persistent_result = run(batch.q, batch.q_rope, batch.kv, batch.kv_rope,
                                        batch.kv_indptr, big_indices, batch.sink,
                                        jax_mla.make_workspace(128, 4))
  check(batch, *split_result, "split, pool > 4 GiB")
  check(batch, *persistent_result, "persistent, pool > 4 GiB")
