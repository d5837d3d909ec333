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
     r"q must be uint8 packed rows \(with q_rope\) or bf16/f32 values \(with q_rope=None\); "
     r"got int8"),
    ("q_float_with_rope", dict(q=np.zeros((2, 16, 512), np.float32)), {}, ValueError,
     r"q holds float32 values with the RoPE in dims 448..511; pass q_rope=None"),
    ("q_packed_without_rope", dict(q_rope=None), {}, ValueError,
     r"q_rope is required with packed uint8 q"),
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
     r"kv_indptr must have num_seqs \+ 1 = 3 \(shared lists\) entries, with num_seqs = "
     r"len\(q\) / tokens_per_seq = 2; got shape \(0,\)"),
    ("kv_indptr_short", dict(kv_indptr=np.array([0], np.int32)), {}, ValueError,
     r"kv_indptr must have num_seqs \+ 1 = 3 .*got shape \(1,\)"),
    ("kv_indptr_per_token", dict(kv_indptr=np.array([0, 1, 2, 3], np.int32)),
     dict(tokens_per_seq=2), ValueError,
     r"kv_indptr must have num_seqs \+ 1 = 2 \(shared lists\) or num_seqs \* tokens_per_seq "
     r"\+ 1 = 3 \(a list per query token\) entries.*got shape \(4,\)"),
    ("kv_float_with_rope", dict(kv=np.zeros((512, 512), ml_dtypes.bfloat16)), {}, ValueError,
     r"kv holds unquantized bfloat16 rows with their RoPE in dims 448..511; pass kv_rope=None"),
    ("kv_packed_without_rope", dict(kv_rope=None), {}, ValueError,
     r"kv_rope is required with packed uint8 rows kv"),
    ("kv_dtype", dict(kv=np.zeros((512, 512), np.int8)), {}, TypeError,
     r"kv must be uint8 packed rows or bf16/f32 rows; got int8"),
    ("kv_indices_rank", dict(kv_indices=np.zeros((7, 1), np.int32)), {}, ValueError,
     r"kv_indices must have rank 1"),
    ("token_count", dict(kv_indptr=np.array([0, 3, 5, 7], np.int32)), {}, ValueError,
     r"kv_indptr must have num_seqs \+ 1 = 3 .*got shape \(4,\)"),
    ("tokens_not_dividing", {}, dict(tokens_per_seq=3), ValueError,
     r"q must have num_seqs \* tokens_per_seq rows, a multiple of tokens_per_seq = 3; got 2"),
    ("extra_type", {}, dict(extra=(1, 2, 3, 4)), TypeError,
     r"extra must be a jax_mla.KVSource or None; got tuple"),
    ("extra_indptr", {}, dict(extra="short_indptr"), ValueError,
     r"extra.kv_indptr must have num_seqs \+ 1 = 3 .*got shape \(2,\)"),
    ("extra_rope", {}, dict(extra="no_rope"), ValueError,
     r"extra.kv_rope is required with packed uint8 rows extra.kv"),
    ("scale_zero", {}, dict(softmax_scale=0.0), ValueError,
     r"softmax_scale must be positive and finite; got 0.0"),
    ("scale_array", {}, dict(softmax_scale=np.ones(1)), TypeError,
     r"softmax_scale must be a Python float or None \(a static value\)"),
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
  kwargs = dict(kwargs)  # the cases are shared with decode_persistent's test
  if kwargs.get("extra") == "short_indptr":
    kwargs["extra"] = jax_mla.KVSource(args["kv"], args["kv_rope"], np.array([0, 3], np.int32),
                                       args["kv_indices"])
  elif kwargs.get("extra") == "no_rope":
    kwargs["extra"] = jax_mla.KVSource(args["kv"], None, args["kv_indptr"], args["kv_indices"])
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


# decode_persistent checks Q, its KV source, the sink and the scalars as decode does (one
# source, one token per row): the same cases, with the same messages, but those of decode-only
# arguments; then its own. The head count is checked last (backends.check_layout), so the
# 16-head arguments reach every check. "max_rows" makes the workspace, "workspace" replaces it.
DECODE_ONLY = {"kv_indptr_per_token", "tokens_not_dividing", "extra_type", "extra_indptr",
               "extra_rope", "splits_zero", "splits_float", "splits_bool", "tokens_zero"}
PERSISTENT_CASES = [c for c in CASES if c[0] not in DECODE_ONLY] + [
    ("kv_rope_rows_message", dict(kv_rope=np.zeros((3, 64), ml_dtypes.bfloat16)), {},
     ValueError, r"kv_rope must have shape \(512, 64\) \(kv is \(512, 512\)\); got \(3, 64\)"),
    ("kv_float", dict(kv=np.zeros((512, 512), np.float32), kv_rope=None,
                      kv_indptr=np.array([0, 3, 7], np.int64)), {}, TypeError,
     r"kv_indptr must have dtype int32; got int64"),
    ("workspace_type", {}, dict(workspace="ws"), TypeError,
     r"workspace must be a jax_mla Workspace \(from jax_mla.make_workspace\), got str"),
    ("workspace_rows", {}, dict(max_rows=1), ValueError,
     r"N = 2 rows exceeds workspace.max_rows = 1; make the workspace with "
     r"make_workspace\(..., max_rows=2\) or larger"),
    ("sink_shape_message", dict(sink=np.zeros(8, np.float32)), {}, ValueError,
     r"sink must have shape \(16,\) \(one logit per head\); got \(8,\)"),
    ("float_q_sink_shape", dict(q=np.zeros((2, 16, 512), np.float32), q_rope=None,
                                sink=np.zeros(8, np.float32)), {}, ValueError,
     r"sink must have shape \(16,\) \(one logit per head\); got \(8,\)"),
    ("extra", {}, dict(extra="source"), ValueError,
     r"decode_persistent takes one KV source: AMD's nm_ps kernel reads one pool"),
]


@pytest.mark.parametrize("name,change,kwargs,exc,pattern", PERSISTENT_CASES,
                         ids=[c[0] for c in PERSISTENT_CASES])
def test_decode_persistent_bad_input_raises_naming_the_argument(args, name, change, kwargs, exc,
                                                                pattern):
  args.update(change)
  kwargs = dict(kwargs, backend=kwargs.get("backend", "reference"))  # a copy: cases are shared
  workspace = kwargs.pop("workspace", None)
  if workspace is None:
    workspace = jax_mla.make_workspace(num_partitions=8, max_rows=kwargs.pop("max_rows", 16))
  if kwargs.get("extra") == "source":
    kwargs["extra"] = jax_mla.KVSource(args["kv"], args["kv_rope"], args["kv_indptr"],
                                       args["kv_indices"])
  with pytest.raises(exc, match=pattern):
    jax_mla.decode_persistent(**args, workspace=workspace, **kwargs)


ROWS = np.zeros((8, 512), np.uint8)
ROPE = np.zeros((8, 64), ml_dtypes.bfloat16)
CONVERTER_CASES = [
    # (converter, its block or page size, packed, rope, exception, message pattern)
    ("to_flashmla", 4, ROWS[:, :448], ROPE, ValueError,
     r"packed must have a last dimension of 512; got shape \(8, 448\)"),
    ("to_tpu_inference", 4, ROWS.astype(np.int8), ROPE, TypeError,
     r"packed must have dtype uint8; got int8"),
    ("to_flashmla", 4, ROWS, ROPE.astype(np.float32), TypeError,
     r"rope must have dtype bfloat16; got float32"),
    ("to_flashmla", 4, ROWS[None], ROPE, ValueError,
     r"to_flashmla takes packed \[R, 512\] and rope \[R, 64\]; got \(1, 8, 512\) and \(8, 64\)"),
    ("to_tpu_inference", 4, ROWS, ROPE[:4], ValueError,
     r"to_tpu_inference takes packed \[R, 512\] and rope \[R, 64\]; got \(8, 512\) and "
     r"\(4, 64\)"),
    ("to_flashmla", 3, ROWS, ROPE, ValueError,
     r"the number of rows \(8\) must be a multiple of block_size \(3\)"),
    ("to_flashmla", 0, ROWS, ROPE, ValueError,
     r"the number of rows \(8\) must be a multiple of block_size \(0\)"),
    ("to_tpu_inference", 12, ROWS, ROPE, ValueError,
     r"the number of rows \(8\) must be a multiple of page_size \(12\)"),
    ("to_tpu_inference", 2.0, ROWS[:4], ROPE, ValueError,  # the rows are checked first
     r"to_tpu_inference takes packed \[R, 512\] and rope \[R, 64\]"),
]


@pytest.mark.parametrize("converter,size,packed,rope,exc,pattern", CONVERTER_CASES)
def test_converters_check_their_rows_alike(converter, size, packed, rope, exc, pattern):
  with pytest.raises(exc, match=pattern):
    getattr(jax_mla, converter)(jnp.asarray(packed), jnp.asarray(rope), size)
