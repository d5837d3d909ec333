"""Merging softmax results computed without the sink by their lse, adding the sink once: the one
home of that arithmetic, shared by `adapters.merge_by_lse` (one result per KV source) and
`pallas.merge` (one partial per KV split: its jnp merge and, inside its Triton kernel, the tile
body). Plain jnp, so it imports without `jax.experimental.pallas` and traces inside a kernel.

The contracts, the same as a single decode's: a part with lse = -inf saw nothing and contributes
nothing, whatever its out holds (its weight is selected, not multiplied, to 0); NaN counts as
seen, so a NaN lse makes its row NaN; a sink of +inf gives out 0 and lse +inf; a row that no
part saw gives out 0 and lse = its sink.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax


def _over(combine, x, axis: int, unroll: bool):
  """x reduced by `combine` (jnp.maximum or jnp.add) over `axis`, kept with size 1; with
  `unroll`, slice by slice (the axis is static) instead of one reduction."""
  if not unroll:
    return (jnp.max if combine is jnp.maximum else jnp.sum)(x, axis=axis, keepdims=True)
  return functools.reduce(combine, (lax.index_in_dim(x, i, axis) for i in range(x.shape[axis])))


def _terms(part_lse, sink, axis: int, unroll: bool):
  """(seen, terms exp(lse_part - m) (0 where unseen), m made finite, the terms' total, the lse
  with the sink), m the parts' max lse; `axis` kept with size 1."""
  seen = part_lse != -jnp.inf  # NaN counts as seen, so a NaN scale propagates
  mx = _over(jnp.maximum, part_lse, axis, unroll)
  any_seen = mx != -jnp.inf
  mx_safe = jnp.where(any_seen, mx, 0.0)
  terms = jnp.where(seen, jnp.exp(part_lse - mx_safe), 0.0)
  total = _over(jnp.add, terms, axis, unroll)
  lse_kv = jnp.where(any_seen, mx_safe + jnp.log(jnp.where(any_seen, total, 1.0)), -jnp.inf)
  return seen, terms, mx_safe, total, jnp.logaddexp(lse_kv, sink)


def weights(part_lse, sink, axis: int):
  """Each part's weight along the parts' `axis`.

  Args:
    part_lse: f32, natural-log denominators without the sink (-inf: the part saw nothing).
    sink: f32 sink logits, broadcastable against `part_lse` with `axis` of size 1 (-inf: none).
    axis: the parts' axis of `part_lse`.

  Returns:
    `(seen, shares, lse)`: whether each part saw anything, its share exp(lse_part - lse) (0 where
    unseen), and the lse with the sink, `axis` kept with size 1.
  """
  seen, _, _, _, lse = _terms(part_lse, sink, axis, unroll=False)
  return seen, jnp.where(seen, jnp.exp(part_lse - lse), 0.0), lse


def merge(parts, part_lse, sink, axis: int, unroll: bool = False):
  """The merged output and lse: `parts` `[..., D]` (f32, each normalized by its own lse)
  weighted by exp(lse_part - m) (m the parts' max lse), summed by one `jnp.sum` over `axis`,
  and divided once by those weights' total plus exp(sink - m): the shares of `weights`, with
  the division after the sum. `unroll`: m and the total from the parts slice by slice rather
  than by reductions (the same values up to the order of the total's additions; why:
  `pallas.merge.merge_partials`).

  Returns:
    `(out f32, lse f32)`: out without `axis`, lse with `axis` kept with size 1.
  """
  seen, terms, mx_safe, total, lse = _terms(part_lse, sink, axis, unroll)
  num = jnp.sum(jnp.where(seen[..., None], parts * terms[..., None], 0.0), axis=axis)
  denom = jnp.squeeze(total + jnp.exp(sink - mx_safe), axis)[..., None]
  # Rows no part saw (total 0; any part seen puts a 1 in it) are 0, whatever their denominator;
  # NaN stays NaN; a +inf sink makes denom +inf and the row 0.
  seen_any = jnp.squeeze(total != 0, axis)[..., None]
  return jnp.where(seen_any, num / denom, 0.0), lse
