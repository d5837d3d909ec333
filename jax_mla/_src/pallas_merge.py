"""Merging the Pallas kernel's per-split partials, in jnp (XLA fuses it into one GPU pass).

Every split writes its partial (an empty split writes o = 0, lse = -inf), and the weights are
selected, not multiplied, so a partial with lse = -inf never contributes, whatever its o holds.
"""

from __future__ import annotations

import jax.numpy as jnp


def merge_partials(parts, part_lse, sink_rows):
  """Combines split partials into the final result.

  Args:
    parts: f32 [B, S, R, 512], each split's softmax-normalized output (0 where it saw nothing).
    part_lse: f32 [B, S, R], natural-log denominators without the sink (-inf: nothing seen).
    sink_rows: f32 [R], the sink logit of each row (-inf: none; +inf: the output is 0).

  Returns:
    (out bf16 [B, R, 512], lse f32 [B, R]), lse with the sink included.
  """
  seen = part_lse != -jnp.inf  # NaN counts as seen, so a NaN scale propagates
  mx = jnp.max(part_lse, axis=1)  # [B, R]
  any_seen = mx != -jnp.inf
  mx_safe = jnp.where(any_seen, mx, 0.0)
  weights = jnp.where(seen, jnp.exp(part_lse - mx_safe[:, None]), 0.0)
  total = jnp.sum(weights, axis=1)
  lse_kv = jnp.where(any_seen, mx_safe + jnp.log(jnp.where(any_seen, total, 1.0)), -jnp.inf)
  lse = jnp.logaddexp(lse_kv, sink_rows[None, :])
  # Each split's share of the full denominator; a +inf sink makes every share exp(-inf) = 0.
  shares = jnp.where(seen, jnp.exp(part_lse - lse[:, None]), 0.0)
  out = jnp.sum(jnp.where(seen[..., None], parts * shares[..., None], 0.0), axis=1)
  return out.astype(jnp.bfloat16), lse


def finish(results, num_splits, sink_rows, *, rows, num_tokens, num_heads):
  """The kernel's results (final, or partials when num_splits > 1, then merged here) as
  (out bf16 [T, H, 512], lse f32 [T, H]), padding rows dropped."""
  out, lse = results if num_splits == 1 else merge_partials(*results, sink_rows)
  out = out[:, :rows]
  return (out.reshape(num_tokens, num_heads, out.shape[-1]),
          lse[:, :rows].reshape(num_tokens, num_heads))
