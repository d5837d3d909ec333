"""jax.vmap of the kernel primitives: the mapped axis is folded into rows of one kernel call, and
the results equal the unbatched calls (bit for bit on the host backend for the split path)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from support.compare import assert_bit_identical, assert_close
from support.rows import equal_width_batches, make_batch
import jax_mla
from jax_mla._src.aiter import split as split_kernel
from jax_mla._src.aiter.persistent import decode_persistent
from jax_mla._src.aiter.split import split_decode
from jax_mla._src.workspace import make_workspace

# Ragged per batch element: empty sequences, several tiles, one very short.
LENGTHS = ([3, 0, 40], [70, 1, 0], [0, 0, 5], [33, 97, 2])


def batches(num_heads, count, *, pool_rows=48, sink=0.5, seed=0):
  """`count` Batches of 3 sequences with equal-length kv_indices (padded with junk entries)."""
  return equal_width_batches(np.random.default_rng(seed), count, num_heads=num_heads,
                             lengths=LENGTHS, pool_rows=pool_rows, sink=sink, extra=3)


def stack(values, shape):
  return np.stack(values).reshape(shape + values[0].shape)


def assert_same(name, actual, expected):
  assert_bit_identical(name, actual, expected, what="the unbatched result")


def vmapped(fn, in_axes, depth):
  for _ in range(depth):
    fn = jax.vmap(fn, in_axes=in_axes)
  return fn


# --- the split path -----------------------------------------------------------------------------

def split_fn(num_kv_splits):
  return functools.partial(split_decode, tokens_per_seq=1, num_kv_splits=num_kv_splits,
                           backend="host", return_lse=num_kv_splits != 1)


@pytest.mark.parametrize("shape", [(2,), (2, 2)], ids=["1 axis", "2 axes"])
@pytest.mark.parametrize("shared_pool", [False, True], ids=["own pool", "shared pool"])
@pytest.mark.parametrize("num_kv_splits", [1, 3])
def test_split_vmap_equals_unbatched_calls(num_kv_splits, shared_pool, shape):
  count = int(np.prod(shape))
  bs = batches(16, count, seed=num_kv_splits)
  if shared_pool:  # one pool for everyone: each element's indices point into it unchanged
    for b in bs:
      b.kv, b.kv_rope = bs[0].kv, bs[0].kv_rope
  fn = split_fn(num_kv_splits)
  batched = [stack([getattr(b, f) for b in bs], shape)
             for f in ("q", "q_rope", "kv", "kv_rope", "kv_indptr", "kv_indices")]
  pool_axis = None if shared_pool else 0
  if shared_pool:
    batched[2], batched[3] = bs[0].kv, bs[0].kv_rope
  in_axes = (0, 0, pool_axis, pool_axis, 0, 0, None)
  out, lse = jax.jit(vmapped(fn, in_axes, len(shape)))(*batched, bs[0].sink)
  out = np.asarray(out).reshape((count,) + out.shape[len(shape):])
  lse = None if lse is None else np.asarray(lse).reshape((count,) + lse.shape[len(shape):])
  single = jax.jit(fn)
  for i, b in enumerate(bs):
    want_out, want_lse = single(*b.args()[:6], b.sink)
    assert_same(f"out[{i}]", out[i], want_out)
    if lse is not None:
      assert_same(f"lse[{i}]", lse[i], want_lse)


@pytest.mark.parametrize("num_kv_splits", [1, 3])
def test_split_vmap_is_one_kernel_call_not_a_loop(num_kv_splits):
  bs = batches(16, 4)
  args = [np.stack([getattr(b, f) for b in bs])
          for f in ("q", "q_rope", "kv", "kv_rope", "kv_indptr", "kv_indices")]
  jaxpr = jax.make_jaxpr(jax.vmap(split_fn(num_kv_splits), in_axes=(0,) * 6 + (None,)))(
      *args, bs[0].sink).jaxpr
  names = [e.primitive.name for e in jaxpr.eqns]
  assert names.count("jax_mla_split_decode") == 1, names
  assert not {"scan", "while"} & set(names), names
  (call,) = [e for e in jaxpr.eqns if e.primitive.name == "jax_mla_split_decode"]
  assert call.invars[0].aval.shape == (4 * 3, 16, 512)  # V*T rows
  assert call.invars[4].aval.shape == (4 * 3 + 1,)  # V*B sequences
  assert call.params["num_kv_splits"] == num_kv_splits  # the unbatched call's plan


def test_split_vmap_with_batched_sink_runs_the_calls_in_turn():
  bs = batches(16, 3)
  rng = np.random.default_rng(5)
  sinks = rng.standard_normal((3, 16)).astype(np.float32)
  args = [np.stack([getattr(b, f) for b in bs])
          for f in ("q", "q_rope", "kv", "kv_rope", "kv_indptr", "kv_indices")]
  fn = split_fn(2)
  jaxpr = jax.make_jaxpr(jax.vmap(fn))(*args, sinks).jaxpr
  assert "scan" in [e.primitive.name for e in jaxpr.eqns]  # documented: not folded
  out, lse = jax.jit(jax.vmap(fn))(*args, sinks)
  for i, b in enumerate(bs):
    want_out, want_lse = jax.jit(fn)(*b.args()[:6], sinks[i])
    assert_same(f"out[{i}]", out[i], want_out)
    assert_same(f"lse[{i}]", lse[i], want_lse)


def test_public_decode_vmaps_host_and_reference():
  bs = batches(16, 2)
  args = [np.stack([getattr(b, f) for b in bs])
          for f in ("q", "q_rope", "kv", "kv_rope", "kv_indptr", "kv_indices")]
  for backend in ("host", "reference"):
    fn = functools.partial(jax_mla.decode, backend=backend, num_kv_splits=2)
    out, lse = jax.jit(jax.vmap(fn, in_axes=(0,) * 6 + (None,)))(*args, bs[0].sink)
    for i, b in enumerate(bs):
      want_out, want_lse = jax.jit(fn)(*b.args())
      assert_same(f"{backend} out[{i}]", out[i], want_out)
      assert_same(f"{backend} lse[{i}]", lse[i], want_lse)


# --- the merge ----------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2,), (2, 3)], ids=["1 axis", "2 axes"])
def test_merge_vmap_equals_unbatched_calls(shape):
  rng = np.random.default_rng(11)
  t, s, h, count = 3, 4, 16, int(np.prod(shape))
  partials = rng.standard_normal((count, t, s, h, 512)).astype(np.float32)
  partial_lse = rng.standard_normal((count, t, s, h)).astype(np.float32)
  valid = rng.integers(0, s + 1, size=(count, t)).astype(np.int32)
  indptr = np.stack([np.concatenate([[0], np.cumsum(rng.integers(0, 200, size=t))])
                     for _ in range(count)]).astype(np.int32)
  sink = rng.standard_normal(h).astype(np.float32)
  fn = functools.partial(split_kernel.merge_splits, tokens_per_seq=1)
  batched = [x.reshape(shape + x.shape[1:]) for x in (partials, partial_lse, valid, indptr)]
  out, lse = jax.jit(vmapped(fn, (0, 0, 0, 0, None), len(shape)))(*batched, sink)
  out = np.asarray(out).reshape((count,) + out.shape[len(shape):])
  lse = np.asarray(lse).reshape((count,) + lse.shape[len(shape):])
  for i in range(count):
    want_out, want_lse = jax.jit(fn)(partials[i], partial_lse[i], valid[i], indptr[i], sink)
    assert_same(f"out[{i}]", out[i], want_out)
    assert_same(f"lse[{i}]", lse[i], want_lse)


# --- the persistent path --------------------------------------------------------------------------

def persistent_args(bs, shape):
  sink = np.asarray(bs[0].sink, np.float32)
  arrays = [stack([getattr(b, f) for b in bs], shape)
            for f in ("q", "q_rope", "kv", "kv_rope", "kv_indptr", "kv_indices")]
  return arrays, sink


@pytest.mark.parametrize("shape", [(2,), (2, 2)], ids=["1 axis", "2 axes"])
@pytest.mark.parametrize("return_lse", [True, False])
def test_persistent_vmap_equals_unbatched_calls(shape, return_lse):
  count = int(np.prod(shape))
  bs = batches(128, count, pool_rows=40)
  arrays, sink = persistent_args(bs, shape)
  workspace = make_workspace(8, 3 * count, allow_any_partitions=True)
  fn = functools.partial(decode_persistent, backend="host", return_lse=return_lse)

  def call(q, q_rope, kv, kv_rope, kv_indptr, kv_indices):
    out, lse, _ = fn(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, workspace)
    return out, lse

  out, lse = jax.jit(vmapped(call, 0, len(shape)))(*arrays)
  out = np.asarray(out.astype(jnp.float32)).reshape((count, 3, 128, 512))
  single = jax.jit(lambda *a: fn(*a, sink, make_workspace(8, 3, allow_any_partitions=True))[:2])
  for i, b in enumerate(bs):
    want_out, want_lse = single(*b.args()[:6])
    # The folded call plans its partitions over V*N rows: a row may be split differently than
    # alone, so the f32 partials can round differently (bf16 out: a couple of ulps at most).
    scale = float(np.max(np.abs(np.asarray(want_out.astype(jnp.float32)))))
    assert_close(f"out[{i}]", out[i], np.asarray(want_out.astype(jnp.float32)),
                 atol=scale * 2.0**-7, rtol=2.0**-8)
    if return_lse:
      got = np.asarray(lse).reshape((count, 3, 128))[i]
      assert_close(f"lse[{i}]", got, np.asarray(want_lse), atol=1e-4, rtol=1e-5, cos_tol=None)
    else:
      assert lse is None


def test_persistent_vmap_folds_rows_into_one_call():
  bs = batches(128, 4, pool_rows=40)
  arrays, sink = persistent_args(bs, (4,))
  workspace = make_workspace(8, 12, allow_any_partitions=True)
  jaxpr = jax.make_jaxpr(jax.vmap(
      lambda *a: decode_persistent(*a, sink, workspace, backend="host")[0]))(*arrays).jaxpr
  names = [e.primitive.name for e in jaxpr.eqns]
  assert names.count("jax_mla_persistent_decode") == 1 and "scan" not in names, names
  (call,) = [e for e in jaxpr.eqns if e.primitive.name == "jax_mla_persistent_decode"]
  assert call.invars[0].aval.shape == (12, 128, 512)


def test_persistent_vmap_refuses_a_vmapped_workspace_and_too_many_rows():
  bs = batches(128, 2, pool_rows=40)
  arrays, sink = persistent_args(bs, (2,))
  workspace = make_workspace(8, 3, allow_any_partitions=True)
  stacked = jax.tree.map(lambda a: jnp.stack([a, a]), workspace)
  with pytest.raises(ValueError, match="workspace must not be vmapped"):
    jax.vmap(lambda ws, *a: decode_persistent(*a, sink, ws, backend="host")[0])(stacked, *arrays)
  with pytest.raises(ValueError, match=r"folds 2 x 3 = 6 rows.*max_rows >= 6"):
    jax.vmap(lambda *a: decode_persistent(*a, sink, workspace, backend="host")[0])(*arrays)


def test_persistent_vmap_with_batched_sink_threads_the_workspace():
  bs = batches(128, 2, pool_rows=40)
  arrays, _ = persistent_args(bs, (2,))
  sinks = np.random.default_rng(3).standard_normal((2, 128)).astype(np.float32)
  workspace = make_workspace(8, 3, allow_any_partitions=True)

  def call(*a):
    out, lse, ws = decode_persistent(*a, workspace, backend="host")
    return out, lse, ws.cnt

  out, lse, cnt = jax.jit(jax.vmap(call))(*arrays, sinks)
  assert not np.asarray(cnt).any()  # counters back at zero after the ordered calls
  for i, b in enumerate(bs):
    want_out, want_lse, _ = jax.jit(call)(*b.args()[:6], sinks[i])
    assert_same(f"out[{i}]", out[i], want_out)
    assert_same(f"lse[{i}]", lse[i], want_lse)



def test_split_vmap_mtp_tokens_and_other_axes():
  """tokens_per_seq = 2, q mapped on its axis 1, indices mapped, the pool shared, indptr not
  mapped (every element has the same lengths)."""
  rng = np.random.default_rng(9)
  bs = [make_batch(rng, num_heads=16, lengths=[4, 0, 50], tokens_per_seq=2, pool_rows=40,
                   sink=0.25) for _ in range(3)]
  fn = functools.partial(split_decode, tokens_per_seq=2, num_kv_splits=2, backend="host")
  q = np.stack([b.q for b in bs], axis=1)  # [T, V, H, 512]
  q_rope = np.stack([b.q_rope for b in bs])
  indices = np.stack([b.kv_indices for b in bs])
  in_axes = (1, 0, None, None, None, 0, None)
  out, lse = jax.jit(jax.vmap(fn, in_axes=in_axes))(q, q_rope, bs[0].kv, bs[0].kv_rope,
                                                    bs[0].kv_indptr, indices, bs[0].sink)
  for i, b in enumerate(bs):
    want_out, want_lse = jax.jit(fn)(b.q, b.q_rope, bs[0].kv, bs[0].kv_rope, bs[0].kv_indptr,
                                     b.kv_indices, b.sink)
    assert_same(f"out[{i}]", out[i], want_out)
    assert_same(f"lse[{i}]", lse[i], want_lse)
