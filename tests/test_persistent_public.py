"""The public decode_persistent: backend choice, sink=None, and agreement between backends."""

import jax
import numpy as np
import pytest

import jax_mla
from support.compare import assert_close
from support.oracle import oracle_decode
from support.rows import make_batch


@pytest.fixture(scope="module")
def batch():
  return make_batch(np.random.default_rng(0), num_heads=128, lengths=[0, 70, 5, 300], sink=0.25)


@pytest.mark.parametrize("backend", ["auto", "host", "reference"])
def test_backends_agree_with_the_oracle(batch, backend):
  ws = jax_mla.make_workspace(num_partitions=8, max_rows=16)
  f = jax.jit(lambda *a: jax_mla.decode_persistent(*a, backend=backend))
  out, lse, ws2 = f(*batch.args(), ws)
  want_out, want_lse = oracle_decode(*batch.args())
  scale = np.abs(want_out).max()
  assert_close("out", np.asarray(out, np.float32), want_out, atol=scale * 2.0**-7, rtol=2.0**-8)
  assert_close("lse", np.asarray(lse), want_lse, atol=1e-3, rtol=1e-5, cos_tol=None)
  assert not np.asarray(ws2.cnt).any()


def test_sink_none_means_no_sink(batch):
  ws = jax_mla.make_workspace(num_partitions=8, max_rows=16)
  args = list(batch.args())
  args[-1] = None
  out, lse, _ = jax_mla.decode_persistent(*args, ws, backend="host")
  assert not np.asarray(out, np.float32)[0].any() and np.all(np.asarray(lse)[0] == -np.inf)
  want_out, _ = oracle_decode(*args)
  assert_close("out", np.asarray(out, np.float32), want_out,
               atol=np.abs(want_out).max() * 2.0**-7, rtol=2.0**-8)


def test_reference_backend_checks_the_same_arguments(batch):
  ws = jax_mla.make_workspace(num_partitions=8, max_rows=2)
  with pytest.raises(ValueError, match="exceeds workspace.max_rows = 2"):
    jax_mla.decode_persistent(*batch.args(), ws, backend="reference")
  with pytest.raises(ValueError, match="backend must be one of"):
    jax_mla.decode_persistent(*batch.args(), ws, backend="fast")
