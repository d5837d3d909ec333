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



@dataclasses.dataclass(frozen=True)
class DecodeDims:
  num_tokens: int  # T
  num_heads: int  # H
  num_kv_rows: int  # R
  num_seqs: int  # B
  num_indices: int  # L
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


def check_decode_args(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, *,
                      tokens_per_seq, num_kv_splits) -> DecodeDims:
  """Checks the arguments of `jax_mla.decode`; returns the problem's dimensions."""
  check_positive_int("tokens_per_seq", tokens_per_seq)
  check_positive_int("num_kv_splits", num_kv_splits, allow_none=True)
  check_array("q", q, ndim=3, dtype=jnp.uint8, last=layout.ROW_BYTES)
  num_tokens, num_heads = _shape(q)[:2]
  if num_heads < 1:
    raise ValueError(f"q must have at least one head; got shape {_shape(q)}")
  check_array("q_rope", q_rope, ndim=3, dtype=jnp.bfloat16, last=layout.ROPE_DIM)
  if _shape(q_rope)[:2] != (num_tokens, num_heads):
    raise ValueError(f"q_rope must have shape {(num_tokens, num_heads, layout.ROPE_DIM)} "
                     f"(q is {_shape(q)}); got {_shape(q_rope)}")
  check_array("kv", kv, ndim=2, dtype=jnp.uint8, last=layout.ROW_BYTES)
  num_kv_rows = _shape(kv)[0]
  if num_kv_rows < 1:
    raise ValueError(f"kv must hold at least one row; got shape {_shape(kv)}")
  check_array("kv_rope", kv_rope, ndim=2, dtype=jnp.bfloat16, last=layout.ROPE_DIM)
  if _shape(kv_rope)[0] != num_kv_rows:
    raise ValueError(f"kv_rope must have shape {(num_kv_rows, layout.ROPE_DIM)} (kv is "
                     f"{_shape(kv)}); got {_shape(kv_rope)}")
  check_array("kv_indptr", kv_indptr, ndim=1, dtype=jnp.int32)
  num_seqs = _shape(kv_indptr)[0] - 1
  if num_seqs < 0:
    raise ValueError(f"kv_indptr must have num_seqs + 1 >= 1 entries; got shape "
                     f"{_shape(kv_indptr)}")
  check_array("kv_indices", kv_indices, ndim=1, dtype=jnp.int32)
  if num_tokens != num_seqs * tokens_per_seq:
    raise ValueError(
        f"q must have num_seqs * tokens_per_seq = {num_seqs} * {tokens_per_seq} = "
        f"{num_seqs * tokens_per_seq} rows (num_seqs = len(kv_indptr) - 1); got {num_tokens}")
  if sink is not None:
    check_array("sink", sink, ndim=1, dtype=jnp.float32)
    if _shape(sink) != (num_heads,):
      raise ValueError(f"sink must have shape ({num_heads},) (one logit per head); got "
                       f"{_shape(sink)}")
  return DecodeDims(num_tokens, num_heads, num_kv_rows, num_seqs, _shape(kv_indices)[0],
                    tokens_per_seq)


def check_persistent_args(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink,
                          workspace) -> int:
  """Checks the arguments of `jax_mla.decode_persistent` (sink already an array); returns N.

  The head count is the backend's to check (backends.check_layout)."""
  ws_lib.check_workspace(workspace)
  check_array("q", q, ndim=3, dtype=jnp.uint8, last=layout.ROW_BYTES)
  num_rows, num_heads = _shape(q)[:2]
  if num_rows > ws_lib.MAX_ROWS:
    raise ValueError(f"N = {num_rows} rows exceeds the kernel's limit of {ws_lib.MAX_ROWS} (its "
                     "byte offsets wrap above it); split the batch")
  if num_rows > workspace.max_rows:
    raise ValueError(f"N = {num_rows} rows exceeds workspace.max_rows = {workspace.max_rows}; "
                     f"make the workspace with make_workspace(..., max_rows={num_rows}) or larger")
  check_array("q_rope", q_rope, ndim=3, dtype=jnp.bfloat16)
  _check_shape("q_rope", q_rope, (num_rows, num_heads, layout.ROPE_DIM), f"(q is {_shape(q)})")
  check_array("kv", kv, ndim=2, dtype=jnp.uint8, last=layout.ROW_BYTES)
  check_array("kv_rope", kv_rope, ndim=2, dtype=jnp.bfloat16)
  _check_shape("kv_rope", kv_rope, (_shape(kv)[0], layout.ROPE_DIM), f"(kv is {_shape(kv)})")
  check_array("kv_indptr", kv_indptr, ndim=1, dtype=jnp.int32)
  _check_shape("kv_indptr", kv_indptr, (num_rows + 1,), "(N + 1 for N rows of q)")
  check_array("kv_indices", kv_indices, ndim=1, dtype=jnp.int32)
  check_array("sink", sink, ndim=1, dtype=jnp.float32)
  _check_shape("sink", sink, (num_heads,), "(one logit per head)")
  return num_rows


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
