"""Shared helpers of the gfx950 tier: running both kernels and checking them against the float64
oracle with the kernels' own suites' tolerance (KERNELS.md section 6), non-finite masks first."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jax_mla
from support.compare import assert_close
from support.oracle import oracle_decode

# The kernels' suites: rtol = atol = 3e-2 against the fp8-dequant reference, plus cosine.
TOL = 3e-2


def sink_or_none(batch, num_heads):
  return (np.full(num_heads, -np.inf, np.float32) if batch.sink is None
          else np.asarray(batch.sink, np.float32))


def check(batch, out, lse, name=""):
  num_heads = batch.q.shape[1]
  want_out, want_lse = oracle_decode(*batch.args()[:6], sink_or_none(batch, num_heads),
                                     batch.tokens_per_seq)
  out = np.asarray(jnp.asarray(out, jnp.float32))
  scale = max(np.abs(want_out[np.isfinite(want_out)]).max(initial=0.0), 1e-30)
  assert_close(f"{name} out", out, want_out, atol=TOL * scale, rtol=TOL, cos_tol=1e-4)
  if lse is not None:
    finite = want_lse[np.isfinite(want_lse)]
    assert_close(f"{name} lse", np.asarray(lse), want_lse,
                 atol=TOL * max(1.0, np.abs(finite).max(initial=1.0)), rtol=TOL, cos_tol=None)


def split(batch, num_kv_splits=None, return_lse=True):
  f = jax.jit(lambda *a: jax_mla.decode(*a, tokens_per_seq=batch.tokens_per_seq,
                                        num_kv_splits=num_kv_splits, backend="gfx950",
                                        return_lse=return_lse))
  return f(*batch.args())


def persistent(batch, workspace, return_lse=True):
  f = jax.jit(lambda *a: jax_mla.decode_persistent(*a, backend="gfx950", return_lse=return_lse),
              donate_argnums=(7,))
  return f(*batch.args()[:6], sink_or_none(batch, 128), workspace)
