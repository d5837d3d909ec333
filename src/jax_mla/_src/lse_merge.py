"""Merging softmax results computed without the sink by their lse, adding the sink once: the one
home of that arithmetic, shared by `adapters.merge_by_lse` (one result per KV source) and
`pallas.merge` (one partial per KV split: its jnp merge and, inside its Triton kernel, the tile
body) and, through `terms`, the Mosaic kernel's cluster merge. Plain jnp, so it imports without
`jax.experimental.pallas` and traces inside a kernel.

The contracts, the same as a single decode's: a part with lse = -inf saw nothing and contributes
nothing, whatever its out holds (its weight is selected, not multiplied, to 0); NaN counts as
seen, so a NaN lse makes its row NaN; a sink of +inf gives out 0 and lse +inf; a row that no
part saw gives out 0 and lse = its sink.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax


class Terms(NamedTuple):
  """The parts' weights before the sink: seen (whether each part saw anything), terms
  (exp(lse_part - mx), 0 where unseen), mx (the parts' max lse, 0 where none saw anything),
  any_seen, total (the terms' sum) and lse_kv (the lse of what the parts saw, -inf where none
  did)."""
  seen: Any
  terms: Any
  mx: Any
  any_seen: Any
  total: Any
  lse_kv: Any


def terms(part_lse, fold, exp=jnp.exp, log=jnp.log) -> Terms:
  """The parts' Terms: the one home of the weights' arithmetic, for the parts as one array
  (`fold(combine, x)` reduces its parts' axis to size 1) or as a list of arrays, one per part
  (`fold` = functools.reduce; the cluster merge inside the Mosaic kernel). `exp` and `log` are
  the lse's base (jnp.exp2 and jnp.log2 for the kernels' log2 units); seen and terms have
  part_lse's structure."""
  seen = jax.tree.map(lambda x: x != -jnp.inf, part_lse)  # NaN counts as seen: it propagates
  mx = fold(jnp.maximum, part_lse)
  any_seen = mx != -jnp.inf
  mx_safe = jnp.where(any_seen, mx, 0.0)
  part_terms = jax.tree.map(lambda s, x: jnp.where(s, exp(x - mx_safe), 0.0), seen, part_lse)
  total = fold(jnp.add, part_terms)
  lse_kv = jnp.where(any_seen, mx_safe + log(jnp.where(any_seen, total, 1.0)), -jnp.inf)
  return Terms(seen, part_terms, mx_safe, any_seen, total, lse_kv)


def _axis_fold(axis: int, unroll: bool):
  """fold for parts on `axis` of one array, kept with size 1; with `unroll`, slice by slice
  (the axis is static) instead of one reduction."""
  def fold(combine, x):
    if not unroll:
      return (jnp.max if combine is jnp.maximum else jnp.sum)(x, axis=axis, keepdims=True)
    return functools.reduce(combine, (lax.index_in_dim(x, i, axis) for i in range(x.shape[axis])))
  return fold


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
  t = terms(part_lse, _axis_fold(axis, unroll=False))
  lse = jnp.logaddexp(t.lse_kv, sink)
  return t.seen, jnp.where(t.seen, jnp.exp(part_lse - lse), 0.0), lse


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
  t = terms(part_lse, _axis_fold(axis, unroll))
  num = jnp.sum(jnp.where(t.seen[..., None], parts * t.terms[..., None], 0.0), axis=axis)
  denom = jnp.squeeze(t.total + jnp.exp(sink - t.mx), axis)[..., None]
  # Rows no part saw (total 0; any part seen puts a 1 in it) are 0, whatever their denominator;
  # NaN stays NaN; a +inf sink makes denom +inf and the row 0.
  seen_any = jnp.squeeze(t.total != 0, axis)[..., None]
  return jnp.where(seen_any, num / denom, 0.0), jnp.logaddexp(t.lse_kv, sink)
