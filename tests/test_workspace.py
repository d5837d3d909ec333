"""make_workspace / reset_workspace / workspace validation."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mla._src.workspace import (CNT_ENTRIES, Workspace, check_workspace, make_workspace,
                                    reset_workspace)


def test_shapes_dtypes_and_contents():
  ws = make_workspace(16, 100)
  assert ws.o_acc.shape == (32, 128, 512) and ws.o_acc.dtype == jnp.float32
  assert ws.lse_acc.shape == (32, 128) and ws.lse_acc.dtype == jnp.float32
  assert ws.desc.shape == (16, 8) and ws.desc.dtype == jnp.int32
  assert ws.cnt.shape == (CNT_ENTRIES,) and ws.cnt.dtype == jnp.uint32
  assert CNT_ENTRIES == 2 * 65536 + 16 * 512 + 4 * 1024 == 143360
  assert ws.arange.shape == (101,) and ws.arange.dtype == jnp.int32
  np.testing.assert_array_equal(ws.arange, np.arange(101))
  for a in (ws.o_acc, ws.lse_acc, ws.desc, ws.cnt):
    assert not np.asarray(a).any()
  assert ws.num_partitions == 16 and ws.max_rows == 100


def test_default_size_is_64_mib_of_o_acc():
  ws = make_workspace()
  assert ws.num_partitions == 128 and ws.max_rows == 32768
  assert ws.o_acc.nbytes == 64 * 2**20
  assert ws.nbytes == sum(a.nbytes for a in jax.tree.leaves(ws))
  assert "o_acc 64.0 MiB" in ws.size_text and "num_partitions=128" in repr(ws)


def test_is_a_pytree_of_five_arrays():
  ws = make_workspace(8, 4)
  leaves, tree = jax.tree.flatten(ws)
  assert len(leaves) == 5
  again = jax.tree.unflatten(tree, leaves)
  assert isinstance(again, Workspace) and again.num_partitions == 8
  doubled = jax.jit(lambda w: jax.tree.map(lambda x: x, w))(ws)
  assert isinstance(doubled, Workspace)


@pytest.mark.parametrize("p", [8, 64, 128, 1024])
def test_partition_counts(p):
  assert make_workspace(p, 8).num_partitions == p


def test_non_multiple_of_8_needs_the_opt_out():
  with pytest.raises(ValueError, match=r"multiple of 8, got 12.*XCD-aware"):
    make_workspace(12)
  assert make_workspace(12, 8, allow_any_partitions=True).num_partitions == 12


@pytest.mark.parametrize("p", [0, -8, 1032, 2048])
def test_partition_range(p):
  with pytest.raises(ValueError, match=r"num_partitions must be in \[1, 1024\]"):
    make_workspace(p, allow_any_partitions=True)


@pytest.mark.parametrize("bad", [8.0, "8", True, None])
def test_partition_type(bad):
  with pytest.raises(TypeError, match="num_partitions must be an int"):
    make_workspace(bad)


@pytest.mark.parametrize("rows", [0, 32769, -1])
def test_max_rows_range(rows):
  with pytest.raises(ValueError, match=r"max_rows must be in \[1, 32768\]"):
    make_workspace(8, rows)


def test_reset_zeroes_counters_and_descriptors_only():
  ws = make_workspace(8, 16)
  dirty = dataclasses.replace(ws, cnt=ws.cnt.at[77].set(3), desc=ws.desc + 5,
                              o_acc=ws.o_acc + 1)
  clean = reset_workspace(dirty)
  assert not np.asarray(clean.cnt).any() and not np.asarray(clean.desc).any()
  np.testing.assert_array_equal(clean.o_acc, dirty.o_acc)
  np.testing.assert_array_equal(clean.arange, ws.arange)
  assert isinstance(jax.jit(reset_workspace)(dirty), Workspace)


@pytest.mark.parametrize("field,bad,message", [
    ("o_acc", jnp.zeros((8, 128, 512), jnp.float32), r"workspace.o_acc must be float32\[16, 128, 512\]"),
    ("lse_acc", jnp.zeros((16, 128), jnp.float16), r"workspace.lse_acc must be float32\[16, 128\]"),
    ("cnt", jnp.zeros((1000,), jnp.uint32), r"workspace.cnt must be uint32\[143360\]"),
    ("cnt", jnp.zeros((CNT_ENTRIES,), jnp.int32), r"workspace.cnt must be uint32"),
    ("arange", jnp.zeros((10,), jnp.float32), r"workspace.arange must be int32"),
    ("desc", jnp.zeros((8, 4), jnp.int32), r"workspace.desc must have shape \[P, 8\]"),
])
def test_inconsistent_workspace_is_refused(field, bad, message):
  ws = dataclasses.replace(make_workspace(8, 9), **{field: bad})
  with pytest.raises(ValueError, match=message):
    check_workspace(ws)


def test_not_a_workspace():
  with pytest.raises(TypeError, match="must be a jax_mla Workspace"):
    check_workspace({"o_acc": 1})
