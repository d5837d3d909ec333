"""jax.vmap of the kernel primitives: a vmapped axis of size V is folded into rows, one kernel call.

The kernels already take a ragged batch of sequences, so V batches of B sequences are one batch of
V*B sequences: q rows are concatenated, each batch's kv_indices are compacted into one flat list
(offset by v*R when the KV pool is batched too; an unbatched pool is shared) and kv_indptr is
rebuilt over the compacted list. The static split count is a primitive parameter, so the folded
call keeps the unbatched call's plan (the host backend gives bit-identical results).

Not folded:
- a batched sink: one kernel call takes one sink per head, so the V calls run one after another
  (`lax.map`, or a `lax.scan` threading the workspace for the persistent path);
- a batched persistent workspace: a workspace serves ordered calls; refused with an error.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# jax.interpreters.batching.not_mapped is None; it is not exported under that name everywhere.
NOT_MAPPED = None


def _axis_size(args, dims) -> int:
  return next(a.shape[d] for a, d in zip(args, dims) if d is not NOT_MAPPED)


def _lead(x, dim, size):
  """x with the vmapped axis first, broadcast to `size` when x is not mapped."""
  if dim is NOT_MAPPED:
    return jnp.broadcast_to(x, (size,) + x.shape)
  return jnp.moveaxis(x, dim, 0)


def _fold(x):
  return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


def _unfold(x, size):
  return x.reshape((size, x.shape[0] // size) + x.shape[1:])


def fold_pool(kv, kv_rope, kv_dim, rope_dim, size):
  """(kv, kv_rope, rows per batch element or 0): a batched pool is stacked, an unbatched one shared."""
  if kv_dim is NOT_MAPPED and rope_dim is NOT_MAPPED:
    return kv, kv_rope, 0
  kv, kv_rope = _lead(kv, kv_dim, size), _lead(kv_rope, rope_dim, size)
  return _fold(kv), _fold(kv_rope), kv.shape[1]


def fold_indices(kv_indptr, kv_indices, pool_rows):
  """[V, B+1] indptr and [V, L] indices -> one [V*B+1] indptr over one compacted [V*L] list.

  Batch v's entries kv_indices[v, indptr[v,0]:indptr[v,B]] are laid end to end, each offset by
  v * pool_rows (0 for a shared pool); entries past the total are 0 and never read.
  """
  size, num_indices = kv_indices.shape
  first, last = kv_indptr[:, 0], kv_indptr[:, -1]
  counts = jnp.maximum(last - first, 0)
  starts = jnp.cumsum(counts) - counts  # where batch v begins in the compacted list
  folded_indptr = (kv_indptr[:, :-1] - first[:, None] + starts[:, None]).reshape(-1)
  folded_indptr = jnp.concatenate([folded_indptr, jnp.sum(counts, keepdims=True)])
  # Position j of the compacted list comes from batch v = the last start <= j.
  j = jnp.arange(size * num_indices, dtype=jnp.int32)
  v = jnp.clip(jnp.searchsorted(starts, j, side="right") - 1, 0, size - 1).astype(jnp.int32)
  src = jnp.clip(first[v] + j - starts[v], 0, num_indices - 1)
  values = kv_indices[v, src] + v * pool_rows
  folded_indices = jnp.where(j < folded_indptr[-1], values, 0)
  return folded_indptr.astype(jnp.int32), folded_indices.astype(jnp.int32)


def arange_indptr(num_seqs: int, step: int):
  """0, step, 2*step, ...: the qo_indptr / split_indptr of V*B sequences."""
  return jnp.arange(num_seqs + 1, dtype=jnp.int32) * step


def _check_arange_operand(x, dim, name):
  if dim is not NOT_MAPPED:
    raise NotImplementedError(f"vmap over the kernel's {name} operand is not supported; it is "
                              "built by jax_mla from the static shapes")


# --- the split kernel ----------------------------------------------------------------------------

def split_decode_rule(prim, args, dims, **params):
  """Batching rule of jax_mla_split_decode (bound with `prim`)."""
  num_kv_splits, tokens_per_seq = params["num_kv_splits"], params["tokens_per_seq"]
  q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, qo_indptr, split_indptr = args
  size = _axis_size(args, dims)
  _check_arange_operand(qo_indptr, dims[7], "qo_indptr")
  _check_arange_operand(split_indptr, dims[8], "split_indptr")
  if dims[6] is not NOT_MAPPED:  # one sink per head per call: run the V calls in turn
    return _sequential(prim, args, dims, size, params)
  q, q_rope = _fold(_lead(q, dims[0], size)), _fold(_lead(q_rope, dims[1], size))
  kv, kv_rope, pool_rows = fold_pool(kv, kv_rope, dims[2], dims[3], size)
  kv_indptr, kv_indices = fold_indices(_lead(kv_indptr, dims[4], size),
                                       _lead(kv_indices, dims[5], size), pool_rows)
  num_seqs = kv_indptr.shape[0] - 1
  results = prim.bind(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink,
                      arange_indptr(num_seqs, tokens_per_seq),
                      arange_indptr(num_seqs, num_kv_splits), **params)
  return [_unfold(r, size) for r in results], [0] * len(results)


def _sequential(prim, args, dims, size, params):
  """The V calls one after another with lax.map (each one a plain kernel call)."""
  mapped = [i for i, d in enumerate(dims) if d is not NOT_MAPPED]
  xs = [jnp.moveaxis(args[i], dims[i], 0) for i in mapped]

  def one(xs_slice):
    call_args = list(args)
    for i, x in zip(mapped, xs_slice):
      call_args[i] = x
    return prim.bind(*call_args, **params)

  results = jax.lax.map(one, xs)
  return list(results), [0] * len(results)


# --- the merge (pure jnp) ------------------------------------------------------------------------

def merge_rule(impl, args, dims, **params):
  """Batching rule of jax_mla_merge_splits: vmap of its jnp implementation."""
  outs = jax.vmap(lambda *a: impl(*a, **params), in_axes=tuple(dims), out_axes=0)(*args)
  return list(outs), [0] * len(outs)


# --- the persistent kernel -----------------------------------------------------------------------

_NUM_INPUTS = 7


def persistent_rule(prim, args, dims, *, backend, return_lse, fill_unwritten_nan, num_partitions):
  """Batching rule of jax_mla_persistent_decode (bound with `prim`): V*N rows in one call."""
  from jax_mla._src import workspace as ws_lib  # pylint: disable=import-outside-toplevel
  params = dict(backend=backend, return_lse=return_lse, fill_unwritten_nan=fill_unwritten_nan,
                num_partitions=num_partitions)
  if any(d is not NOT_MAPPED for d in dims[_NUM_INPUTS:]):
    raise ValueError(
        "decode_persistent under jax.vmap: the workspace must not be vmapped. One workspace "
        "serves ordered calls; the vmapped rows are folded into one call that uses the one "
        "unbatched workspace (make it with max_rows >= V * N). For one workspace per device, see "
        "jax_mla.sharding.make_sharded_workspace.")
  size = _axis_size(args, dims)
  q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink = args[:_NUM_INPUTS]
  workspace = list(args[_NUM_INPUTS:])
  if dims[6] is not NOT_MAPPED:  # one sink per head per call: the V calls in turn
    return _sequential_persistent(prim, args, dims, size, params)
  q, q_rope = _fold(_lead(q, dims[0], size)), _fold(_lead(q_rope, dims[1], size))
  folded_rows, num_rows = q.shape[0], q.shape[0] // size
  max_rows = workspace[-1].shape[0] - 1  # arange [max_rows + 1]
  limit = min(max_rows, ws_lib.MAX_ROWS)
  if folded_rows > limit:
    raise ValueError(
        f"decode_persistent under jax.vmap folds {size} x {num_rows} = {folded_rows} rows into "
        f"one call, more than {limit} (workspace.max_rows = {max_rows}, kernel limit "
        f"{ws_lib.MAX_ROWS}); make the workspace with max_rows >= {folded_rows} or vmap over "
        "fewer rows")
  kv, kv_rope, pool_rows = fold_pool(kv, kv_rope, dims[2], dims[3], size)
  kv_indptr, kv_indices = fold_indices(_lead(kv_indptr, dims[4], size),
                                       _lead(kv_indices, dims[5], size), pool_rows)
  out, lse, *new_ws = prim.bind(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, *workspace,
                                **params)
  return [_unfold(out, size), _unfold(lse, size) if return_lse else
          jnp.zeros((size, 0, lse.shape[1]), lse.dtype), *new_ws], \
      [0, 0] + [NOT_MAPPED] * len(new_ws)


def _sequential_persistent(prim, args, dims, size, params):
  """The V calls in turn, threading the one workspace through a lax.scan (calls stay ordered)."""
  mapped = [i for i, d in enumerate(dims[:_NUM_INPUTS]) if d is not NOT_MAPPED]
  xs = [jnp.moveaxis(args[i], dims[i], 0) for i in mapped]

  def step(workspace, xs_slice):
    call_args = list(args[:_NUM_INPUTS])
    for i, x in zip(mapped, xs_slice):
      call_args[i] = x
    out, lse, *new_ws = prim.bind(*call_args, *workspace, **params)
    return new_ws, (out, lse)

  workspace, (out, lse) = jax.lax.scan(step, list(args[_NUM_INPUTS:]), xs)
  return [out, lse, *workspace], [0, 0] + [NOT_MAPPED] * len(workspace)
