"""The persistent one-launch decode path (AMD's nm_ps kernel), with its workspace as an operand.

decode_persistent (checks every argument) -> primitive `jax_mla_persistent_decode` (static
attributes) -> abstract eval -> lowering: "rocm" and "cpu" both call the FFI target
`jax_mla_persistent_decode_v1`, registered per platform (ROCM: an Initialize stage that loads the
code object's module, then plan + HIP launch, command-buffer compatible; cpu: plan + the host
executor, which runs the same kernarg bytes on the CPU).

FFI contract (operands, then results):
  q u8 [N,128,512], q_rope bf16 [N,128,64], kv u8 [R,512], kv_rope bf16 [R,64],
  kv_indptr i32 [N+1], kv_indices i32 [L], sink f32 [128],
  o_acc f32 [2P,128,512], lse_acc f32 [2P,128], desc i32 [P,8], cnt u32 [143360], arange i32 [M+1]
  -> out bf16 [N,128,512], lse f32 [N,128] (or [0,128] when return_lse=False: nothing allocated,
     the kernarg's lse pointer is 0), o_acc, lse_acc, desc, cnt, arange (aliased to operands 7..11).
Attributes: num_partitions i32, return_lse bool; on cpu also fill_unwritten_nan bool.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir, xla

from jax_mla._src import checks, ext, layout
from jax_mla._src.aiter import empty_rows, guards
from jax_mla._src.aiter import vmap_rules
from jax_mla._src import workspace as ws_lib

TARGET = "jax_mla_persistent_decode_v1"
_NUM_INPUTS = 7
_WORKSPACE_FIELDS = ("o_acc", "lse_acc", "desc", "cnt", "arange")
# Operand i of the workspace (7..11) aliases result i - 5 (2..6).
_ALIASES = {_NUM_INPUTS + i: 2 + i for i in range(len(_WORKSPACE_FIELDS))}

persistent_decode_p = Primitive("jax_mla_persistent_decode")
persistent_decode_p.multiple_results = True
persistent_decode_p.def_impl(functools.partial(xla.apply_primitive, persistent_decode_p))


def decode_persistent(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, workspace, *,
                      return_lse: bool = True, backend: str = "host"):
  """Sparse fp8 MLA decode for 128 heads, one query token per row, in one kernel launch.

  Args:
    q: uint8 [N, 128, 512] packed query rows (448 fp8 e4m3fn + 14 e8m0 scale bytes + padding).
    q_rope: bfloat16 [N, 128, 64].
    kv: uint8 [R, 512] packed KV rows; kv_rope: bfloat16 [R, 64].
    kv_indptr: int32 [N + 1]; row r attends to kv rows kv_indices[kv_indptr[r]:kv_indptr[r+1]].
    kv_indices: int32 [L].
    sink: float32 [128] per-head sink logits; -inf for none.
    workspace: a Workspace from make_workspace, with N <= workspace.max_rows. Pass the returned
      one to the next call; donate it under jit to avoid a copy.
    return_lse: False puts 0 in the kernel's lse slot, so the kernel writes no lse, and returns
      None for it (the FFI lse result is then [0, 128], no memory).
    backend: "gfx950" (ROCm MI355X, AMD's code object) or "host" (the CPU executor of the same
      kernel arguments).

  Returns:
    (out bf16 [N, 128, 512], lse f32 [N, 128] natural log including the sink, or None, workspace).
    Rows with no KV entries give out = 0 and lse = sink.
  """
  return decode_persistent_raw(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, workspace,
                               return_lse=return_lse, backend=backend, fix_empty_rows=True)


def decode_persistent_raw(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, workspace, *,
                          return_lse=True, backend="host", fix_empty_rows=True,
                          fill_unwritten_nan=False):
  """decode_persistent with its test switches: fix_empty_rows=False returns the kernel's output
  as is (rows with K = 0 unwritten), "select"/"scatter" force one fix-up method (True picks by
  backend: select on host, scatter on gfx950); fill_unwritten_nan=True (host only) makes the
  unwritten rows NaN first."""
  _check_static(return_lse, backend, fill_unwritten_nan)
  n = checks.check_persistent_args(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink,
                                   workspace)
  # Sharded operands outside shard_map would be gathered onto every device: refuse them.
  guards.check_not_partitioned("decode_persistent", q, q_rope, kv, kv_rope, kv_indptr,
                                 kv_indices, sink, *jax.tree.leaves(workspace))
  if n == 0:
    lse = jnp.zeros((0, ws_lib.NUM_HEADS), jnp.float32) if return_lse else None
    return jnp.zeros((0, ws_lib.NUM_HEADS, layout.HEAD_DIM), jnp.bfloat16), lse, workspace
  results = persistent_decode_p.bind(
      q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink,
      *(getattr(workspace, f) for f in _WORKSPACE_FIELDS),
      backend=backend, return_lse=bool(return_lse), fill_unwritten_nan=bool(fill_unwritten_nan),
      num_partitions=workspace.num_partitions)
  out, lse = results[0], results[1]
  new_ws = ws_lib.Workspace(*results[2:])
  if fix_empty_rows is not False:
    method = empty_rows.METHODS[backend] if fix_empty_rows is True else fix_empty_rows
    out, lse = empty_rows.fix(out, lse if return_lse else None, kv_indptr, sink,
                              tokens_per_seq=1, method=method)
  return out, (lse if return_lse else None), new_ws


# ---------------------------------------------------------------------------- argument checks

def _check_static(return_lse, backend, fill_unwritten_nan):
  if backend not in empty_rows.METHODS:
    raise ValueError(f"backend must be 'gfx950' or 'host' for the persistent primitive, got "
                     f"{backend!r}")
  if not isinstance(return_lse, (bool, np.bool_)):
    raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
  if fill_unwritten_nan and backend != "host":
    raise ValueError("fill_unwritten_nan is a test aid of the host backend only")


# ---------------------------------------------------------------------------- primitive rules

def _abstract_eval(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, o_acc, lse_acc, desc,
                   cnt, arange, *, backend, return_lse, fill_unwritten_nan, num_partitions):
  del q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, backend, fill_unwritten_nan
  n = q.shape[0]
  if desc.shape[0] != num_partitions:
    raise ValueError(f"num_partitions={num_partitions} does not match the workspace (P="
                     f"{desc.shape[0]})")
  out = jax.core.ShapedArray((n, ws_lib.NUM_HEADS, layout.HEAD_DIM), jnp.bfloat16)
  lse = jax.core.ShapedArray((n if return_lse else 0, ws_lib.NUM_HEADS), jnp.float32)
  workspace = [jax.core.ShapedArray(a.shape, a.dtype) for a in (o_acc, lse_acc, desc, cnt, arange)]
  return [out, lse, *workspace]


persistent_decode_p.def_abstract_eval(_abstract_eval)


# vmap folds the mapped axis into rows (V*N <= workspace.max_rows) and refuses a vmapped
# workspace; see vmap_rules.py.
batching.primitive_batchers[persistent_decode_p] = functools.partial(
    vmap_rules.persistent_rule, persistent_decode_p)


def _lowering(platform):
  ffi_rule = jax.ffi.ffi_lowering(TARGET, operand_output_aliases=_ALIASES)

  def rule(ctx, *operands, backend, return_lse, fill_unwritten_nan, num_partitions):
    guards.check_lowering_not_replicated(ctx, "decode_persistent")  # plain jit, many devices
    want = "host" if platform == "cpu" else "gfx950"
    if backend != want:
      raise NotImplementedError(
          f"decode_persistent(backend={backend!r}) cannot run on platform {platform!r}: "
          f"backend {want!r} is the one for {platform!r}")
    attrs = dict(num_partitions=np.int32(num_partitions), return_lse=bool(return_lse))
    if platform == "cpu":
      ext.ensure_registered()
      attrs["fill_unwritten_nan"] = bool(fill_unwritten_nan)
    else:
      if fill_unwritten_nan:
        raise NotImplementedError("fill_unwritten_nan exists on the host backend only")
      try:  # a CPU-only machine may export for rocm without the extension built
        ext.ensure_registered()
      except ImportError:
        pass
    return ffi_rule(ctx, *operands, **attrs)

  return rule


def _unsupported_platform(ctx, *operands, **params):
  platforms = getattr(ctx.module_context, "platforms", ("this platform",))
  raise NotImplementedError(
      f"The persistent decode path runs only on ROCm gfx950 (backend='gfx950') or the CPU "
      f"(backend='host'), not on {', '.join(platforms)}; use jax_mla.decode(..., "
      "backend='reference') there.")


mlir.register_lowering(persistent_decode_p, _lowering("rocm"), platform="rocm")
mlir.register_lowering(persistent_decode_p, _lowering("cpu"), platform="cpu")
mlir.register_lowering(persistent_decode_p, _unsupported_platform)
