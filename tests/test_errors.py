"""Bad inputs raise before any work, with messages naming the argument, expected and actual."""

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_mla
from support.rows import make_batch


@pytest.fixture
def args():
  b = make_batch(np.random.default_rng(0), num_heads=16, lengths=[3, 4], sink=0.0)
  return dict(q=b.q, q_rope=b.q_rope, kv=b.kv, kv_rope=b.kv_rope, kv_indptr=b.kv_indptr,
              kv_indices=b.kv_indices, sink=b.sink)


CASES = [
    # (name, change to the arguments, keyword overrides, exception, message pattern)
    ("q_rank", dict(q=np.zeros((2, 512), np.uint8)), {}, ValueError, r"q must have rank 3"),
    ("q_dtype", dict(q=np.zeros((2, 16, 512), np.int8)), {}, TypeError,
     r"q must have dtype uint8; got int8"),
    ("q_width", dict(q=np.zeros((2, 16, 576), np.uint8)), {}, ValueError,
     r"q must have a last dimension of 512"),
    ("q_rope_shape", dict(q_rope=np.zeros((2, 8, 64), ml_dtypes.bfloat16)), {}, ValueError,
     r"q_rope must have shape \(2, 16, 64\)"),
    ("q_rope_dtype", dict(q_rope=np.zeros((2, 16, 64), np.float32)), {}, TypeError,
     r"q_rope must have dtype bfloat16; got float32"),
    ("kv_rank", dict(kv=np.zeros((4, 2, 512), np.uint8)), {}, ValueError, r"kv must have rank 2"),
    ("kv_rope_rows", dict(kv_rope=np.zeros((3, 64), ml_dtypes.bfloat16)), {}, ValueError,
     r"kv_rope must have shape \(512, 64\)"),
    ("kv_indptr_dtype", dict(kv_indptr=np.array([0, 3, 7], np.int64)), {}, TypeError,
     r"kv_indptr must have dtype int32; got int64"),
    ("kv_indptr_empty", dict(kv_indptr=np.zeros((0,), np.int32)), {}, ValueError,
     r"kv_indptr must have num_seqs \+ 1 >= 1 entries"),
    ("kv_indptr_short", dict(kv_indptr=np.array([0], np.int32)), {}, ValueError,
     r"q must have num_seqs \* tokens_per_seq = 0 \* 1 = 0 rows"),
    ("kv_indices_rank", dict(kv_indices=np.zeros((7, 1), np.int32)), {}, ValueError,
     r"kv_indices must have rank 1"),
    ("token_count", dict(kv_indptr=np.array([0, 3, 5, 7], np.int32)), {}, ValueError,
     r"q must have num_seqs \* tokens_per_seq = 3 \* 1 = 3 rows .* got 2"),
    ("sink_shape", dict(sink=np.zeros(8, np.float32)), {}, ValueError,
     r"sink must have shape \(16,\)"),
    ("sink_dtype", dict(sink=np.zeros(16, np.float64)), {}, TypeError,
     r"sink must have dtype float32; got float64"),
    ("sink_not_array", dict(sink=[0.0] * 16), {}, TypeError, r"sink must be an array"),
    ("splits_zero", {}, dict(num_kv_splits=0), ValueError,
     r"num_kv_splits must be a positive int; got 0"),
    ("splits_float", {}, dict(num_kv_splits=2.0), TypeError,
     r"num_kv_splits must be a positive int or None; got 2.0"),
    ("splits_bool", {}, dict(num_kv_splits=True), TypeError, r"num_kv_splits must be"),
    ("tokens_zero", {}, dict(tokens_per_seq=0), ValueError,
     r"tokens_per_seq must be a positive int; got 0"),
    ("backend_name", {}, dict(backend="cuda"), ValueError,
     r"backend must be one of \('auto', 'gfx950', 'host', 'pallas', 'reference'\); got 'cuda'"),
    ("return_lse", {}, dict(return_lse="yes"), TypeError, r"return_lse must be a bool"),
]


@pytest.mark.parametrize("name,change,kwargs,exc,pattern", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_naming_the_argument(args, name, change, kwargs, exc, pattern):
  args.update(change)
  with pytest.raises(exc, match=pattern):
    jax_mla.decode(**args, backend=kwargs.pop("backend", "reference"), **kwargs)


@pytest.mark.parametrize("backend", ["host", "gfx950"])
@pytest.mark.parametrize("heads,tokens", [(24, 1), (32, 2), (128, 4), (64, 2)])
def test_kernel_backends_reject_unserved_shapes(backend, heads, tokens):
  b = make_batch(np.random.default_rng(1), num_heads=heads, tokens_per_seq=tokens, lengths=[3])
  with pytest.raises(ValueError, match=rf"backend='{backend}' serves \(num_heads, "
                     rf"tokens_per_seq\) in .*got \({heads}, {tokens}\)"):
    jax_mla.decode(*b.args(), tokens_per_seq=tokens, backend=backend)


def test_reference_serves_any_head_count():
  b = make_batch(np.random.default_rng(2), num_heads=24, tokens_per_seq=3, lengths=[3])
  out, lse = jax_mla.decode(*b.args(), tokens_per_seq=3, backend="reference")
  assert out.shape == (3, 24, 512) and lse.shape == (3, 24)


def test_checks_run_before_tracing_under_jit(args):
  import jax  # pylint: disable=import-outside-toplevel
  args["sink"] = jnp.zeros(3, jnp.float32)
  with pytest.raises(ValueError, match="sink must have shape"):
    jax.jit(lambda **a: jax_mla.decode(**a, backend="reference"))(**args)
