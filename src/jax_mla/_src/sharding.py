"""Decode on many devices: `shard_map` recipes, one workspace per device, and the plain-jit guard.

The kernel is one custom call that XLA cannot partition: under a plain `jax.jit` over sharded
inputs XLA would gather every operand onto every device and run the whole batch everywhere. The
recipes here wrap the public decode functions in `shard_map`, so each device runs the custom call
on its own block with no collectives. Layouts (D devices on the mesh axis):

- rows (data-parallel attention): every array is D per-device blocks concatenated along its
  leading axis, sharded P(axis). Block d of kv_indptr holds device-local offsets into block d of
  kv_indices, whose entries are device-local rows of block d of the KV pool.
- heads (tensor parallelism, split path): q/q_rope/sink are split on the head axis, the KV pool
  and indices are replicated; each device serves H/D heads.
"""

from __future__ import annotations

import functools

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from jax_mla._src import checks
from jax_mla._src.api import decode, decode_persistent
from jax_mla._src import workspace as ws_lib


def shard_map(f, *, mesh, in_specs, out_specs):
  """jax.shard_map where it exists (jax >= 0.7 public), else jax.experimental.shard_map.

  check_vma/check_rep is off: the kernel primitives carry no varying-axes rule, and every call
  here is per-shard by construction (no collectives inside)."""
  if hasattr(jax, "shard_map"):
    return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
  from jax.experimental.shard_map import shard_map as legacy  # pylint: disable=import-outside-toplevel
  return legacy(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)


def place(mesh, spec, *arrays):
  """The arrays laid out as `spec` on `mesh`, as shard_map's in_specs need (free for a replicated
  or already matching input: each device keeps its block). Explicit axes need jax.reshard; Auto
  axes a sharding constraint."""
  sharding = NamedSharding(mesh, spec)
  explicit = all(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)
  move = jax.sharding.reshard if explicit else jax.lax.with_sharding_constraint
  return [move(x, sharding) for x in arrays]


def _axis_size(mesh, axis_name) -> int:
  if axis_name not in mesh.axis_names:
    raise ValueError(f"axis {axis_name!r} is not an axis of the mesh {tuple(mesh.axis_names)}")
  return int(mesh.shape[axis_name])


# --- rows across devices ---------------------------------------------------------------------------

def decode_rows_sharded(mesh, axis_name: str, **decode_kwargs):
  """`jax_mla.decode` with rows, KV pool and indices split across `axis_name` (data parallel).

  Returns f(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink=None) -> (out, lse) over global
  arrays made of D per-device blocks (D = mesh.shape[axis_name]) concatenated on the leading axis:
    q [D*T, H, 512], q_rope [D*T, H, 64]           T = B * tokens_per_seq tokens per device
    kv [D*R, 512], kv_rope [D*R, 64]               R pool rows per device
    kv_indptr [D*(B+1)]                            device-local offsets (each block starts at 0)
    kv_indices [D*L]                               device-local pool rows
    sink [H] or None                               replicated
  out [D*T, H, 512] and lse [D*T, H] (None with return_lse=False) come back in the same blocks.
  decode_kwargs are `jax_mla.decode`'s keywords (backend, tokens_per_seq, num_kv_splits, ...).
  """
  _axis_size(mesh, axis_name)
  return_lse = decode_kwargs.get("return_lse", True)
  blocks = P(axis_name)

  def local(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink):
    out, lse = decode(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, **decode_kwargs)
    return (out, lse) if return_lse else out

  mapped = shard_map(local, mesh=mesh, in_specs=(blocks,) * 6 + (P(),),
                     out_specs=(blocks, blocks) if return_lse else blocks)

  def sharded(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink=None):
    sink = checks.as_sink(sink, q.shape[1])
    args = place(mesh, blocks, q, q_rope, kv, kv_rope, kv_indptr, kv_indices)
    result = mapped(*args, *place(mesh, P(), sink))
    return result if return_lse else (result, None)

  return sharded


def decode_persistent_rows_sharded(mesh, axis_name: str, **kwargs):
  """`jax_mla.decode_persistent` with rows split across `axis_name`, one workspace per device.

  Returns f(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, workspace) ->
  (out, lse, workspace), arrays laid out as in `decode_rows_sharded` (kv_indptr [D*(N+1)]) and the
  workspace from `make_sharded_workspace` on the same mesh axis. Donate the workspace under jit.
  kwargs: return_lse, backend.
  """
  _axis_size(mesh, axis_name)
  return_lse = kwargs.get("return_lse", True)
  blocks = P(axis_name)

  def local(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, workspace):
    out, lse, workspace = decode_persistent(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink,
                                            workspace, **kwargs)
    return (out, lse, workspace) if return_lse else (out, workspace)

  out_specs = (blocks, blocks, blocks) if return_lse else (blocks, blocks)
  mapped = shard_map(local, mesh=mesh, in_specs=(blocks,) * 6 + (P(), blocks),
                     out_specs=out_specs)

  def sharded(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, workspace):
    sink = checks.as_sink(sink, q.shape[1])
    args = place(mesh, blocks, q, q_rope, kv, kv_rope, kv_indptr, kv_indices)
    workspace = jax.tree.map(lambda a: place(mesh, blocks, a)[0], workspace)
    result = mapped(*args, *place(mesh, P(), sink), workspace)
    return result if return_lse else (result[0], None, result[1])

  return sharded


def make_sharded_workspace(mesh, axis_name: str, num_partitions: int = 128,
                           max_rows: int = ws_lib.MAX_ROWS, *, allow_any_partitions: bool = False):
  """One zeroed workspace per device of `axis_name`, as one global `Workspace`.

  Each field is D per-device workspaces concatenated on its leading axis (o_acc [D*2P, 128, 512],
  desc [D*P, 8], cnt [D*143360], arange [D*(max_rows+1)], ...), sharded P(axis_name), made on the
  devices themselves. Inside the shard_map of `decode_persistent_rows_sharded` every device sees
  its own [2P, ...] workspace; the global object's num_partitions/max_rows describe the
  concatenation, not one device's workspace. Devices on other mesh axes hold replicas.
  """
  _axis_size(mesh, axis_name)
  make = functools.partial(ws_lib.make_workspace, num_partitions, max_rows,
                           allow_any_partitions=allow_any_partitions)
  make()  # argument errors here, not inside the compiled shard_map
  blocks = P(axis_name)
  mapped = shard_map(make, mesh=mesh, in_specs=(), out_specs=blocks)
  return jax.jit(mapped, out_shardings=NamedSharding(mesh, blocks))()


# --- heads across devices ------------------------------------------------------------------------

def decode_heads_sharded(mesh, axis_name: str, **decode_kwargs):
  """`jax_mla.decode` (split path) with heads split across `axis_name` (tensor parallel).

  Returns f(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink=None) -> (out, lse):
    q [T, H, 512] and q_rope [T, H, 64]   sharded P(None, axis): each device has H/D heads
    sink [H] or None                      sharded P(axis): each device gets its heads' sinks
    kv, kv_rope, kv_indptr, kv_indices    replicated (every head reads the same KV)
  out [T, H, 512] is P(None, axis), lse [T, H] P(None, axis). H/D must be a head count the kernel
  serves (128 heads over 2/4/8 devices: 64/32/16 heads each).
  """
  size = _axis_size(mesh, axis_name)
  return_lse = decode_kwargs.get("return_lse", True)
  heads = P(None, axis_name)

  def local(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink):
    out, lse = decode(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, **decode_kwargs)
    return (out, lse) if return_lse else out

  mapped = shard_map(local, mesh=mesh,
                     in_specs=(heads, heads, P(), P(), P(), P(), P(axis_name)),
                     out_specs=(heads, heads) if return_lse else heads)

  def sharded(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink=None):
    if q.shape[1] % size:
      raise ValueError(f"{q.shape[1]} heads do not split over {size} devices of axis "
                       f"{axis_name!r}")
    sink = checks.as_sink(sink, q.shape[1])
    args = (*place(mesh, heads, q, q_rope), *place(mesh, P(), kv, kv_rope, kv_indptr, kv_indices),
            *place(mesh, P(axis_name), sink))
    result = mapped(*args)
    return result if return_lse else (result, None)

  return sharded
