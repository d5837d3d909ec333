"""Rows without KV entries, which both aiter kernels leave unwritten: the API promises out = 0
and lse = sink there. One fix-up for the split (one split) and the persistent path.

- "scatter" (gfx950): zeros go into the empty rows only; every other row gets the out-of-range
  index T and mode="drop" skips it, so there is no full pass over out. Done on the uint16 bits,
  so no backend widens bf16.
- "select" (host): one fused select over out. XLA:CPU runs a scatter element by element: at
  T = 4096 rows (512 MiB of out) the scatter measured about 360 ms (1.6 s on bf16 directly)
  against 19-31 ms for the select (docs/workspace.md); at T = 64, H = 128, 15-25 ms against
  0.3-0.5 ms (docs/split_path.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# backend -> method (the measured choice for its platform, above).
METHODS = {"gfx950": "scatter", "host": "select"}


def empty_tokens(kv_indptr, tokens_per_seq: int, num_tokens: int):
  """[T] bool: the query tokens of sequences without KV entries."""
  empty = kv_indptr[1:] <= kv_indptr[:-1]
  if tokens_per_seq == 1:
    return empty
  # A broadcast, not jnp.repeat: that lowers to a gather loop.
  return jnp.broadcast_to(empty[:, None], (empty.shape[0], tokens_per_seq)).reshape(num_tokens)


def zero_rows(out, empty, method: str):
  """out [T, ...] with the rows where `empty` [T] holds set to zero."""
  if method == "select":
    return jnp.where(empty.reshape(empty.shape + (1,) * (out.ndim - 1)),
                     jnp.zeros((), out.dtype), out)
  if method == "scatter":
    n = out.shape[0]
    rows = jnp.where(empty, jnp.arange(n, dtype=jnp.int32), jnp.int32(n))
    bits = jax.lax.bitcast_convert_type(out, jnp.uint16)
    bits = bits.at[rows].set(jnp.uint16(0), mode="drop")
    return jax.lax.bitcast_convert_type(bits, out.dtype)
  raise ValueError(f"the empty-row fix-up is 'select' or 'scatter', got {method!r}")


def fix(out, lse, kv_indptr, sink, *, tokens_per_seq: int, method: str):
  """(out, lse) with out = 0 and lse = sink in the rows of empty sequences; lse may be None."""
  empty = empty_tokens(kv_indptr, tokens_per_seq, out.shape[0])
  out = zero_rows(out, empty, method)
  if lse is not None:  # small: always a select
    lse = jnp.where(empty[:, None], sink[None, :], lse)
  return out, lse
