"""Shared helpers of the persistent-path tests: running a Batch through decode_persistent and
checking it against the float64 oracle (non-finite masks first, then abs AND rel AND cosine)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from compare import assert_close
from jax_mla._src.persistent_kernel import decode_persistent, decode_persistent_raw
from jax_mla._src.workspace import make_workspace
from oracle import oracle_decode

NUM_HEADS = 128


def sink_array(batch):
  """decode_persistent takes no None sink: -inf means none."""
  if batch.sink is None:
    return np.full(NUM_HEADS, -np.inf, np.float32)
  return np.asarray(batch.sink, np.float32)


def inputs(batch):
  return (batch.q, batch.q_rope, batch.kv, batch.kv_rope, batch.kv_indptr, batch.kv_indices,
          sink_array(batch))


def run(batch, workspace=None, *, num_partitions=8, raw=False, **kwargs):
  """(out f32 numpy, lse numpy or None, workspace) through one jitted call."""
  if workspace is None:
    workspace = make_workspace(num_partitions, max(len(batch.kv_indptr) - 1, 1),
                               allow_any_partitions=True)
  fn = decode_persistent_raw if raw else decode_persistent
  out, lse, ws = jax.jit(lambda ws, *a: fn(*a, ws, **kwargs))(workspace, *inputs(batch))
  out = np.asarray(jnp.asarray(out, jnp.float32))
  return out, (None if lse is None else np.asarray(lse)), ws


def check_against_oracle(batch, out, lse):
  want_out, want_lse = oracle_decode(*batch.args()[:6], sink_array(batch), 1)
  # bf16 output: 8 significant bits; the budget is a few bf16 ulps of the largest value.
  scale = max(np.abs(want_out[np.isfinite(want_out)]).max(initial=0.0), 1e-30)
  assert_close("out", out, want_out, atol=scale * 2.0**-7, rtol=2.0**-8, cos_tol=1e-5)
  if lse is not None:
    finite = want_lse[np.isfinite(want_lse)]
    assert_close("lse", lse, want_lse, atol=2e-4 * max(1.0, np.abs(finite).max(initial=1.0)),
                 rtol=1e-5, cos_tol=None)


def empty_rows(batch):
  return np.flatnonzero(np.diff(batch.kv_indptr) == 0)
