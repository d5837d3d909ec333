"""Shared helpers of the persistent-path tests: running a Batch through decode_persistent and
checking it against the float64 oracle (non-finite masks first, then abs AND rel AND cosine)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from support.compare import assert_bf16_decode_close
from jax_mla._src.aiter.persistent import decode_persistent, decode_persistent_raw
from jax_mla._src.workspace import make_workspace
from support.oracle import oracle_decode


def inputs(batch):
  return (batch.q, batch.q_rope, batch.kv, batch.kv_rope, batch.kv_indptr, batch.kv_indices,
          batch.sink_array())


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
  assert_bf16_decode_close(out, lse, *oracle_decode(*batch.args()[:6], batch.sink_array(), 1))


def empty_rows(batch):
  return np.flatnonzero(np.diff(batch.kv_indptr) == 0)
