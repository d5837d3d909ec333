"""Using one workspace across calls: in one jit, across jits, in a lax.scan; donation; the counter
rule (zero after every completed call, a poisoned counter is refused, reset_workspace recovers);
and the limits on N, P and H."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from support.persistent_cases import check_against_oracle, inputs, run
from jax_mla import decode_persistent
from jax_mla._src.workspace import make_workspace, reset_workspace
from support.rows import make_batch


def batch(seed, lengths, pool_rows=200):
  return make_batch(np.random.default_rng(seed), num_heads=128, lengths=lengths,
                    pool_rows=pool_rows, sink=0.25)


def fresh(b, p=8):
  out, lse, _ = run(b, num_partitions=p)
  return out, lse


def as_f32(x):
  return np.asarray(jnp.asarray(x, jnp.float32))


def test_reuse_in_one_jit_with_different_n_and_lengths():
  b1, b2 = batch(1, [300, 0, 5]), batch(2, [1, 64, 700, 0, 33, 2, 9], pool_rows=800)

  @jax.jit
  def two_calls(ws, a1, a2):
    o1, l1, ws = decode_persistent(*a1, ws)
    o2, l2, ws = decode_persistent(*a2, ws)
    return o1, l1, o2, l2, ws

  o1, l1, o2, l2, ws = two_calls(make_workspace(8, 16), inputs(b1), inputs(b2))
  for b, o, l in ((b1, o1, l1), (b2, o2, l2)):
    want_o, want_l = fresh(b)
    np.testing.assert_array_equal(as_f32(o), want_o)
    np.testing.assert_array_equal(np.asarray(l), want_l)
  assert not np.asarray(ws.cnt).any()


def test_reuse_across_jits():
  ws = make_workspace(8, 16)
  for seed, lengths in [(3, [2000, 1]), (4, [0, 0, 17]), (5, [40] * 16)]:
    b = batch(seed, lengths, pool_rows=2100)
    out, lse, ws = run(b, ws)
    check_against_oracle(b, out, lse)
    np.testing.assert_array_equal(out, fresh(b)[0])
    assert not np.asarray(ws.cnt).any()


def test_scan_over_decode_steps_with_changing_lengths():
  steps = [[5, 0, 90, 31], [6, 1, 91, 0], [700, 2, 0, 33], [0, 0, 0, 0]]
  bs = [batch(10 + i, lengths, pool_rows=800) for i, lengths in enumerate(steps)]
  # Same shapes every step: pad kv_indices to the longest list.
  width = max(len(b.kv_indices) for b in bs)
  for b in bs:
    b.kv_indices = np.pad(b.kv_indices, (0, width - len(b.kv_indices)))
  stacked = [np.stack(x) for x in zip(*(inputs(b) for b in bs))]

  def step(ws, xs):
    out, lse, ws = decode_persistent(*xs, ws)
    return ws, (out, lse)

  ws, (outs, lses) = jax.jit(lambda ws, xs: jax.lax.scan(step, ws, xs))(
      make_workspace(8, 4), stacked)
  assert not np.asarray(ws.cnt).any()
  for i, b in enumerate(bs):
    want_o, want_l = fresh(b)
    np.testing.assert_array_equal(as_f32(outs[i]), want_o)
    np.testing.assert_array_equal(np.asarray(lses[i]), want_l)


def test_donated_workspace_is_aliased_without_a_copy():
  b = batch(20, [3, 0, 5])
  ws = make_workspace(8, 16)
  f = jax.jit(lambda ws, *a: decode_persistent(*a, ws), donate_argnums=0)
  hlo = f.lower(ws, *inputs(b)).compile().as_text()
  header = hlo.splitlines()[0]
  aliases = re.search(r"input_output_alias=\{(.*?)\}\s*,\s*entry", header) or re.search(
      r"input_output_alias=\{(.*)\}", header)
  assert aliases, f"no input_output_alias in the HloModule header: {header[:300]}"
  # Parameter 0 is o_acc (the workspace's first leaf); every workspace leaf is aliased.
  for param in range(5):
    assert re.search(rf"\(\s*{param}\s*,\s*\{{\}}", aliases.group(1)), (param, aliases.group(1))
  o_acc_type = "f32[16,128,512]"
  copies = [l for l in hlo.splitlines() if o_acc_type in l and re.search(r"\bcopy(-start)?\(", l)]
  assert not copies, f"o_acc is copied: {copies}"
  out, lse, ws2 = f(ws, *inputs(b))
  assert ws.o_acc.is_deleted()
  assert not np.asarray(ws2.cnt).any()


def test_poisoned_counters_are_refused_and_reset_recovers():
  b = batch(21, [7, 0, 70])
  ws = make_workspace(8, 8)
  poisoned = dataclasses.replace(ws, cnt=ws.cnt.at[1234].set(2))
  # The handler returns FAILED_PRECONDITION; XLA:CPU re-wraps it as INTERNAL, so match the text.
  with pytest.raises(jax.errors.JaxRuntimeError,
                     match=r"cnt\[1234\] = 2.*jax_mla.reset_workspace"):
    run(b, poisoned)
  out, lse, ws2 = run(b, reset_workspace(poisoned))
  check_against_oracle(b, out, lse)
  assert not np.asarray(ws2.cnt).any()


def test_arange_is_checked_by_the_host_executor():
  b = batch(22, [3, 4])
  ws = make_workspace(8, 8)
  bad = dataclasses.replace(ws, arange=ws.arange.at[1].set(5))
  with pytest.raises(jax.errors.JaxRuntimeError, match=r"arange\[1\] = 5, expected 1"):
    run(b, bad)


# ---------------------------------------------------------------------------- limits

def shapes(n, heads=128, rows=16, indices=8):
  s = jax.ShapeDtypeStruct
  return (s((n, heads, 512), jnp.uint8), s((n, heads, 64), jnp.bfloat16),
          s((rows, 512), jnp.uint8), s((rows, 64), jnp.bfloat16), s((n + 1,), jnp.int32),
          s((indices,), jnp.int32), s((heads,), jnp.float32))


def test_n_32769_is_refused():
  ws = jax.eval_shape(lambda: make_workspace(8))
  with pytest.raises(ValueError, match=r"N = 32769 rows exceeds the kernel's limit of 32768"):
    jax.eval_shape(lambda *a: decode_persistent(*a, ws), *shapes(32769))


def test_n_32768_has_the_right_shapes():
  ws = jax.eval_shape(lambda: make_workspace(8))
  out, lse, ws2 = jax.eval_shape(lambda *a: decode_persistent(*a, ws), *shapes(32768))
  assert out.shape == (32768, 128, 512) and lse.shape == (32768, 128)
  assert ws2.o_acc.shape == ws.o_acc.shape


def test_workspace_too_small_for_n():
  ws = jax.eval_shape(lambda: make_workspace(8, 10))
  with pytest.raises(ValueError, match=r"N = 11 rows exceeds workspace.max_rows = 10"):
    jax.eval_shape(lambda *a: decode_persistent(*a, ws), *shapes(11))


def test_non_128_heads_is_refused():
  ws = jax.eval_shape(lambda: make_workspace(8, 10))
  with pytest.raises(ValueError, match=r"serves \(num_heads, tokens_per_seq\) in \{\(128, 1\)\}; "
                     r"got \(64, 1\)"):
    jax.eval_shape(lambda *a: decode_persistent(*a, ws), *shapes(4, heads=64))


def test_twelve_partitions_need_the_opt_out_but_then_work():
  with pytest.raises(ValueError, match="multiple of 8"):
    make_workspace(12, 8)
  b = batch(23, [100, 0, 3, 250])
  out, lse, ws = run(b, make_workspace(12, 8, allow_any_partitions=True))
  check_against_oracle(b, out, lse)


@pytest.mark.parametrize("index,bad,error,message", [
    (0, np.zeros((2, 128, 512), np.int8), TypeError,
     r"q must be uint8 packed rows \(with q_rope\) or bf16/f32 values .*; got int8"),
    (1, np.zeros((2, 128, 64), np.float32), TypeError, "q_rope must have dtype bfloat16"),
    (1, np.zeros((2, 128, 32), jnp.bfloat16), ValueError,
     r"q_rope must have a last dimension of 64; got shape \(2, 128, 32\)"),
    (2, np.zeros((16, 511), np.uint8), ValueError, r"kv must have a last dimension of 512; got shape \(16, 511\)"),
    (3, np.zeros((15, 64), jnp.bfloat16), ValueError, r"kv_rope must have shape \(16, 64\)"),
    (4, np.zeros((4,), np.int32), ValueError,
     r"kv_indptr must have num_seqs \+ 1 = 3 \(shared lists\) entries.*got shape \(4,\)"),
    (4, np.zeros((3,), np.int64), TypeError, "kv_indptr must have dtype int32"),
    (5, np.zeros((2, 4), np.int32), ValueError, r"kv_indices must have rank 1; got shape \(2, 4\)"),
    (6, np.zeros((64,), np.float32), ValueError, r"sink must have shape \(128,\)"),
    (6, 0.5, TypeError, "sink must be an array"),
])
def test_bad_arguments_are_named(index, bad, error, message):
  args = [np.zeros(s.shape, s.dtype) for s in shapes(2)]
  args[index] = bad
  with pytest.raises(error, match=message):
    decode_persistent(*args, make_workspace(8, 4))


def test_bad_backend_and_flags():
  args = [np.zeros(s.shape, s.dtype) for s in shapes(2)]
  ws = make_workspace(8, 4)
  with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'gfx950', 'host', "):
    decode_persistent(*args, ws, backend="cuda")
  with pytest.raises(TypeError, match="return_lse must be a bool"):
    decode_persistent(*args, ws, return_lse=1)
  with pytest.raises(NotImplementedError, match="backend='gfx950'.*cannot run on platform 'cpu'"):
    decode_persistent(*args, ws, backend="gfx950")


def test_vmap_folds_rows_and_refuses_what_cannot_fold():
  """vmap folds the mapped rows into one call (tests/test_vmap.py); what cannot fold is refused."""
  args = [np.zeros((3,) + s.shape, s.dtype) for s in shapes(2)]
  ws = make_workspace(8, 4)
  with pytest.raises(ValueError, match="folds 3 x 2 = 6 rows"):
    jax.vmap(lambda *a: decode_persistent(*a, args[6][0], ws)[0])(*args[:6])
  stacked = jax.tree.map(lambda a: jnp.stack([a] * 3), ws)
  with pytest.raises(ValueError, match="workspace must not be vmapped"):
    jax.vmap(lambda w, *a: decode_persistent(*a, w)[0])(stacked, *args)
