"""Argument checks for the public decode functions: every check runs before any work.

Each failure raises ValueError (bad shape or value) or TypeError (bad dtype or type) whose
message names the argument, what was expected and what was given.
"""

from __future__ import annotations

import dataclasses
import numbers

import jax.numpy as jnp
import numpy as np

from jax_mla._src import layout
from jax_mla._src import workspace as ws_lib

FLOAT_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))


@dataclasses.dataclass(frozen=True)
class DecodeDims:
  num_tokens: int  # T
  num_heads: int  # H
  num_seqs: int  # B
  tokens_per_seq: int


def _shape(x) -> tuple:
  return tuple(int(d) for d in x.shape)


def check_array(name: str, x, *, ndim: int, dtype, last: int | None = None) -> None:
  if not (hasattr(x, "shape") and hasattr(x, "dtype")):
    raise TypeError(f"{name} must be an array (jax or numpy); got {type(x).__name__}")
  if len(x.shape) != ndim:
    raise ValueError(f"{name} must have rank {ndim}; got shape {_shape(x)}")
  if jnp.dtype(x.dtype) != jnp.dtype(dtype):
    raise TypeError(f"{name} must have dtype {jnp.dtype(dtype)}; got {jnp.dtype(x.dtype)}")
  if last is not None and x.shape[-1] != last:
    raise ValueError(f"{name} must have a last dimension of {last}; got shape {_shape(x)}")


def check_positive_int(name: str, value, *, allow_none: bool = False) -> None:
  if value is None and allow_none:
    return
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise TypeError(f"{name} must be a positive int{' or None' if allow_none else ''}; "
                    f"got {value!r} of type {type(value).__name__}")
  if value < 1:
    raise ValueError(f"{name} must be a positive int; got {value}")


def check_query(q, q_rope) -> tuple[int, int]:
  """Checks Q, packed (uint8 `[T, H, 512]` + bf16 q_rope `[T, H, 64]`) or as the model holds it
  (bf16/f32 `[T, H, 512]`, q_rope None); returns (T, H)."""
  if not (hasattr(q, "shape") and hasattr(q, "dtype")):
    raise TypeError(f"q must be an array (jax or numpy); got {type(q).__name__}")
  if jnp.dtype(q.dtype) not in (jnp.dtype(jnp.uint8), *FLOAT_DTYPES):
    raise TypeError(f"q must be uint8 packed rows (with q_rope) or bf16/f32 values (with "
                    f"q_rope=None); got {jnp.dtype(q.dtype)}")
  check_array("q", q, ndim=3, dtype=q.dtype, last=layout.ROW_BYTES)
  num_tokens, num_heads = _shape(q)[:2]
  if num_heads < 1:
    raise ValueError(f"q must have at least one head; got shape {_shape(q)}")
  if jnp.dtype(q.dtype) != jnp.dtype(jnp.uint8):
    if q_rope is not None:
      raise ValueError(f"q holds {jnp.dtype(q.dtype)} values with the RoPE in dims 448..511; "
                       "pass q_rope=None")
    return num_tokens, num_heads
  if q_rope is None:
    raise ValueError("q_rope is required with packed uint8 q (q_rope=None is for bf16/f32 q)")
  check_array("q_rope", q_rope, ndim=3, dtype=jnp.bfloat16, last=layout.ROPE_DIM)
  if _shape(q_rope)[:2] != (num_tokens, num_heads):
    raise ValueError(f"q_rope must have shape {(num_tokens, num_heads, layout.ROPE_DIM)} "
                     f"(q is {_shape(q)}); got {_shape(q_rope)}")
  return num_tokens, num_heads


def check_softmax_scale(softmax_scale) -> None:
  if softmax_scale is None:
    return
  if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
    raise TypeError(f"softmax_scale must be a Python float or None (a static value); got "
                    f"{softmax_scale!r} of type {type(softmax_scale).__name__}")
  if not (np.isfinite(softmax_scale) and softmax_scale > 0):
    raise ValueError(f"softmax_scale must be positive and finite; got {softmax_scale}")


def check_decode_args(q, q_rope, sink, *, tokens_per_seq, num_kv_splits) -> DecodeDims:
  """Checks the arguments of `jax_mla.decode` other than the KV sources (sources.check_source);
  returns the problem's dimensions."""
  check_positive_int("tokens_per_seq", tokens_per_seq)
  check_positive_int("num_kv_splits", num_kv_splits, allow_none=True)
  num_tokens, num_heads = check_query(q, q_rope)
  if num_tokens % tokens_per_seq:
    raise ValueError(f"q must have num_seqs * tokens_per_seq rows, a multiple of "
                     f"tokens_per_seq = {tokens_per_seq}; got {num_tokens}")
  if sink is not None:
    check_sink(sink, num_heads)
  return DecodeDims(num_tokens, num_heads, num_tokens // tokens_per_seq, tokens_per_seq)


def check_sink(sink, num_heads: int) -> None:
  """An array sink: f32 `[H]`, one logit per head."""
  check_array("sink", sink, ndim=1, dtype=jnp.float32)
  _check_shape("sink", sink, (num_heads,), "(one logit per head)")


def check_persistent_rest(num_rows: int, num_heads: int, sink, workspace) -> None:
  """What `jax_mla.decode_persistent` checks beyond its Q (`check_query`, giving N and H) and its
  KV source (`sources.check_source`): the workspace, N against the kernel's limit and the
  workspace's, and the sink (already an array)."""
  ws_lib.check_workspace(workspace)
  _check_row_limits(num_rows, workspace)
  check_sink(sink, num_heads)


def check_persistent_args(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink,
                          workspace) -> int:
  """Checks the persistent primitive's operands (packed Q and pool, sink an array), for callers
  of the primitive below the public API; returns N.

  The head count is the backend's to check (backends.check_layout)."""
  ws_lib.check_workspace(workspace)
  check_array("q", q, ndim=3, dtype=jnp.uint8, last=layout.ROW_BYTES)
  num_rows, num_heads = _shape(q)[:2]
  _check_row_limits(num_rows, workspace)
  check_array("q_rope", q_rope, ndim=3, dtype=jnp.bfloat16)
  _check_shape("q_rope", q_rope, (num_rows, num_heads, layout.ROPE_DIM), f"(q is {_shape(q)})")
  check_array("kv", kv, ndim=2, dtype=jnp.uint8, last=layout.ROW_BYTES)
  check_array("kv_rope", kv_rope, ndim=2, dtype=jnp.bfloat16)
  _check_shape("kv_rope", kv_rope, (_shape(kv)[0], layout.ROPE_DIM), f"(kv is {_shape(kv)})")
  check_array("kv_indptr", kv_indptr, ndim=1, dtype=jnp.int32)
  _check_shape("kv_indptr", kv_indptr, (num_rows + 1,), "(N + 1 for N rows of q)")
  check_array("kv_indices", kv_indices, ndim=1, dtype=jnp.int32)
  check_sink(sink, num_heads)
  return num_rows


def _check_row_limits(num_rows: int, workspace) -> None:
  if num_rows > ws_lib.MAX_ROWS:
    raise ValueError(f"N = {num_rows} rows exceeds the kernel's limit of {ws_lib.MAX_ROWS} (its "
                     "byte offsets wrap above it); split the batch")
  if num_rows > workspace.max_rows:
    raise ValueError(f"N = {num_rows} rows exceeds workspace.max_rows = {workspace.max_rows}; "
                     f"make the workspace with make_workspace(..., max_rows={num_rows}) or larger")


def _check_shape(name: str, x, want: tuple, why: str) -> None:
  if _shape(x) != want:
    raise ValueError(f"{name} must have shape {want} {why}; got {_shape(x)}")


def check_bool(name: str, value) -> None:
  if not isinstance(value, bool):
    raise TypeError(f"{name} must be a bool; got {value!r}")


def as_sink(sink, num_heads: int):
  """The sink operand the kernels need: f32 [H], -inf meaning "no sink"."""
  if sink is None:
    return jnp.full((num_heads,), -np.inf, jnp.float32)
  return jnp.asarray(sink, jnp.float32)
