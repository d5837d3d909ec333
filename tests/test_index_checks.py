"""Out-of-range indices: the host executors refuse them (a Python exception naming the entry),
and `check_indices=True` catches them on the device before any launch, on every backend."""

import jax
import numpy as np
import pytest
from jax.experimental import checkify

import jax_mla
from support.rows import make_batch

POOL = 32

def split_batch():
  return make_batch(np.random.default_rng(23), num_heads=16, lengths=[10, 20], pool_rows=POOL)

def persistent_batch():
  return make_batch(np.random.default_rng(13), num_heads=128, lengths=[4, 6], pool_rows=POOL)

def workspace():
  return jax_mla.make_workspace(8, 4)

def spoil(batch, bad):
  """A copy of batch with one contract violation; returns (batch, what check_indices says)."""
  batch.kv_indices = batch.kv_indices.copy()
  batch.kv_indptr = batch.kv_indptr.copy()
  if bad == "index_high":
    batch.kv_indices[7] = POOL
    return batch, rf"kv_indices\[7\] = {POOL} is outside \[0, {POOL}\)"
  if bad == "index_negative":
    batch.kv_indices[2] = -5
    return batch, rf"kv_indices\[2\] = -5 is outside \[0, {POOL}\)"
  if bad == "indptr_decreasing":
    batch.kv_indptr[1] = batch.kv_indptr[2] + 1
    return batch, r"kv_indptr\[2\] = \d+ < kv_indptr\[1\] = \d+ \(must be non-decreasing\)"
  if bad == "indptr_past_end":
    batch.kv_indptr[-1] = len(batch.kv_indices) + 1
    return batch, rf"kv_indptr\[-1\] = {len(batch.kv_indices) + 1} exceeds len\(kv_indices\)"
  if bad == "indptr_negative_start":
    batch.kv_indptr[0] = -1
    return batch, r"kv_indptr\[0\] = -1 must be"
  raise ValueError(bad)

BAD = ["index_high", "index_negative", "indptr_decreasing", "indptr_past_end",
       "indptr_negative_start"]

def run_split(batch, backend, **kw):
  return jax_mla.decode(*batch.args(), backend=backend, num_kv_splits=2, **kw)

def run_persistent(batch, backend, **kw):
  return jax_mla.decode_persistent(*batch.args(), workspace(), backend=backend, **kw)[:2]

PATHS = {"split": (split_batch, run_split), "persistent": (persistent_batch, run_persistent)}

# Without check_indices the host executors check every index they read.
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bad", ["index_high", "index_negative"])
def test_host_refuses_out_of_range_index_naming_it(path, bad):
  make, run = PATHS[path]
  batch, _ = spoil(make(), bad)
  where = 7 if bad == "index_high" else 2
  value = POOL if bad == "index_high" else -5
  with pytest.raises(jax.errors.JaxRuntimeError, match=rf"kv_indices\[{where}\] = {value}"):
    jax.block_until_ready(jax.jit(lambda *a: run(batch, "host"))())

@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("backend", ["host", "reference"])
@pytest.mark.parametrize("bad", BAD)
def test_eager_check_raises_naming_the_entry(path, backend, bad):
  make, run = PATHS[path]
  batch, match = spoil(make(), bad)
  with pytest.raises(checkify.JaxRuntimeError, match="jax_mla check_indices: " + match):
    run(batch, backend, check_indices=True)

@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bad", BAD)
def test_checkify_under_jit_reports_and_the_launch_reads_nothing(path, bad):
  make, run = PATHS[path]
  batch, match = spoil(make(), bad)
  f = jax.jit(checkify.checkify(lambda *a: run(batch, "host", check_indices=True),
                                errors=checkify.user_checks))
  # The host executor would raise on the bad entry: it runs on a neutralised kv_indptr instead.
  err, (out, lse) = f()
  assert err.get() is not None and "jax_mla check_indices" in err.get()
  with pytest.raises(checkify.JaxRuntimeError, match=match):
    err.throw()
  assert not np.asarray(out, np.float32).any()

def test_jit_without_checkify_fails_at_trace_time():
  batch = split_batch()
  with pytest.raises(ValueError, match="checkify"):
    jax.jit(lambda *a: run_split(batch, "host", check_indices=True))()

def test_split_path_requires_a_zero_start():
  batch = split_batch()
  batch.kv_indptr = batch.kv_indptr + 1
  batch.kv_indices = np.concatenate([[0], batch.kv_indices]).astype(np.int32)
  with pytest.raises(checkify.JaxRuntimeError, match=r"kv_indptr\[0\] = 1 must be 0"):
    run_split(batch, "host", check_indices=True)

@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("backend", ["host", "reference"])
def test_valid_indices_give_bit_identical_results(path, backend):
  make, run = PATHS[path]
  batch = make()
  if path == "persistent":  # an offset and trailing entries are valid there
    batch.kv_indices = np.concatenate([[POOL - 1, 0, 3], batch.kv_indices, [POOL + 9]])
    batch.kv_indices = batch.kv_indices.astype(np.int32)
    batch.kv_indptr = batch.kv_indptr + 3
  else:
    batch.kv_indices = np.concatenate([batch.kv_indices, [-1, POOL]]).astype(np.int32)
  f = jax.jit(checkify.checkify(lambda: run(batch, backend, check_indices=True),
                                errors=checkify.user_checks))
  err, (out, lse) = f()
  err.throw()
  want_out, want_lse = jax.jit(lambda: run(batch, backend))()
  assert np.isfinite(np.asarray(out, np.float32)).all()
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(want_out, np.float32))
  np.testing.assert_array_equal(np.asarray(lse), np.asarray(want_lse))
  assert np.asarray(out, np.float32).any()

@pytest.mark.parametrize("path", PATHS)
def test_check_indices_must_be_a_bool(path):
  make, run = PATHS[path]
  with pytest.raises(TypeError, match="check_indices must be a bool"):
    run(make(), "host", check_indices=1)

def test_no_indices_at_all_pass():
  batch = make_batch(np.random.default_rng(0), num_heads=16, lengths=[0, 0], pool_rows=8)
  assert batch.kv_indices.shape == (0,)
  out, lse = jax_mla.decode(*batch.args(), backend="host", check_indices=True)
  assert not np.asarray(out, np.float32).any() and np.all(np.asarray(lse) == -np.inf)
