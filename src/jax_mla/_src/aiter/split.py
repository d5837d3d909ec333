"""The split-plus-merge decode path: the nm kernel (XLA FFI custom call) and the merge.

Data path: `split_decode` -> primitive `jax_mla_split_decode` (static num_kv_splits,
tokens_per_seq, backend, fill_unwritten_nan, merge_in_executor) -> lowering per platform to the
FFI target `jax_mla_split_decode_v1` (rocm: the gfx950 code object through HIP; cpu: the host
executor that runs the same 336 kernarg bytes) -> primitive `jax_mla_merge_splits` (pure jnp).

The host backend merges in its executor instead (`merge_in_executor`, the default there): each
sequence's splits are merged by the thread that finishes its last one, with this module's merge
contract, and the call returns (out, lse) with empty rows already filled, at any split count
(one split included: the executor then adds the LSE the kernel does not write). On 2 cores,
with its partials merged in XLA instead (two splits for the LSE, their partials written, a pass
over them after the call), the host was 1.66-1.95x the reference at batch 1-4, K 512, against
2.03-2.93x (benchmarks/README.md). `merge_in_executor=False` keeps the gfx950 path's merge, which
the host tests run too.

The sink is folded into split 0 by the kernel (inferred for the real kernel, KERNELS.md section 3;
the host executor does the same), so the merge adds no sink term except for a sequence without
any valid split (K = 0), whose lse is the sink.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir, xla

from jax_mla._src import ext, layout
from jax_mla._src.aiter import empty_rows, guards
from jax_mla._src.aiter import planner
from jax_mla._src.aiter import vmap_rules

TARGET = "jax_mla_split_decode_v1"
# Head counts served by padding to one the kernel serves (the result is sliced back).
PADDED_HEADS = {8: 16}
# --- the one shape function -------------------------------------------------------------------

def split_result_shapes(num_tokens: int, num_heads: int, num_seqs: int, num_kv_splits: int,
                        merge_in_executor: bool = False):
  """The kernel's results as ShapeDtypeStructs: [out] when S == 1, else
  [partials, partial_lse, valid_split_count]; merged in the executor, [out, lse] first and the
  kernel's own after them when S > 1 (with S == 1 the kernel's out is the merged out)."""
  t, h, s = num_tokens, num_heads, num_kv_splits
  out = jax.ShapeDtypeStruct((t, h, layout.HEAD_DIM), jnp.bfloat16)
  merged = [out, jax.ShapeDtypeStruct((t, h), jnp.float32)] if merge_in_executor else []
  if s == 1:
    return merged or [out]
  return merged + [jax.ShapeDtypeStruct((t, s, h, layout.HEAD_DIM), jnp.float32),
                   jax.ShapeDtypeStruct((t, s, h), jnp.float32),
                   jax.ShapeDtypeStruct((num_seqs,), jnp.int32)]


# --- primitive: the nm kernel -------------------------------------------------------------------

split_decode_p = Primitive("jax_mla_split_decode")
split_decode_p.multiple_results = True
split_decode_p.def_impl(functools.partial(xla.apply_primitive, split_decode_p))


@split_decode_p.def_abstract_eval
def _split_decode_abstract_eval(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, qo_indptr,
                                split_indptr, *, num_kv_splits, tokens_per_seq, backend,
                                fill_unwritten_nan, merge_in_executor):
  del q_rope, kv, kv_rope, kv_indices, sink, qo_indptr, split_indptr, tokens_per_seq, backend
  del fill_unwritten_nan
  shapes = split_result_shapes(q.shape[0], q.shape[1], kv_indptr.shape[0] - 1, num_kv_splits,
                               merge_in_executor)
  return [jax.core.ShapedArray(s.shape, s.dtype) for s in shapes]


_ffi_rule = jax.ffi.ffi_lowering(TARGET)


def _rocm_backend_present() -> bool:
  try:
    return bool(jax.devices("rocm"))
  except RuntimeError:  # no ROCm backend in this process (e.g. exporting from a CPU machine)
    return False


def _lower_rocm(ctx, *operands, num_kv_splits, tokens_per_seq, backend, fill_unwritten_nan,
                merge_in_executor):
  guards.check_lowering_not_replicated(ctx, "decode")  # plain jit over many devices
  if backend != "gfx950":
    raise ValueError(f"backend={backend!r} cannot run on rocm: the rocm lowering of "
                     f"{TARGET} launches the gfx950 code object (use backend='gfx950')")
  if fill_unwritten_nan:
    raise ValueError("fill_unwritten_nan is a host-backend test option; the gfx950 kernel "
                     "cannot fill what it does not write")
  if merge_in_executor:
    raise ValueError("merge_in_executor is the host executor's; the gfx950 kernel's splits "
                     "are merged in XLA")
  # The ROCM handler must be registered before XLA compiles the call; exporting for rocm from a
  # machine without ROCm needs neither the extension nor a registration.
  if _rocm_backend_present():
    ext.ensure_registered()
  return _ffi_rule(ctx, *operands, num_kv_splits=np.int32(num_kv_splits),
                   tokens_per_seq=np.int32(tokens_per_seq))


def _lower_cpu(ctx, *operands, num_kv_splits, tokens_per_seq, backend, fill_unwritten_nan,
               merge_in_executor):
  guards.check_lowering_not_replicated(ctx, "decode")  # plain jit over many devices
  if backend != "host":
    raise ValueError(f"backend={backend!r} needs a ROCm gfx950 device; this computation is "
                     "lowered for cpu (use backend='host' or backend='reference')")
  ext.ensure_registered()  # the cpu target must exist before XLA compiles the call
  return _ffi_rule(ctx, *operands, num_kv_splits=np.int32(num_kv_splits),
                   tokens_per_seq=np.int32(tokens_per_seq),
                   fill_unwritten_nan=np.bool_(fill_unwritten_nan),
                   merge_in_executor=np.bool_(merge_in_executor))


def _lower_other(ctx, *operands, backend, **params):
  del operands, params
  platforms = getattr(ctx.module_context, "platforms", None)
  raise NotImplementedError(
      f"jax_mla split decode (backend={backend!r}) runs on rocm (gfx950) or cpu (host); this "
      f"computation is lowered for {platforms}. Use backend='reference' on other platforms.")


mlir.register_lowering(split_decode_p, _lower_rocm, platform="rocm")
mlir.register_lowering(split_decode_p, _lower_cpu, platform="cpu")
mlir.register_lowering(split_decode_p, _lower_other)
# vmap folds the mapped axis into rows: one kernel call for all of it (vmap_rules.py).
batching.primitive_batchers[split_decode_p] = functools.partial(
    vmap_rules.split_decode_rule, split_decode_p)


# --- primitive: the merge ------------------------------------------------------------------------

def _merge_impl(partials, partial_lse, valid_split_count, kv_indptr, sink, *, tokens_per_seq):
  """Merges split partials in pure jnp. Masks with select only: unwritten slots may hold NaN."""
  num_tokens, num_splits = partial_lse.shape[:2]
  kv_len = kv_indptr[1:] - kv_indptr[:-1]
  tiles = (kv_len + planner.KV_TILE - 1) // planner.KV_TILE
  valid = jnp.minimum(jnp.minimum(num_splits, tiles), valid_split_count)  # [B]
  valid = jnp.repeat(valid, tokens_per_seq, total_repeat_length=num_tokens)  # [T]
  mask = jnp.arange(num_splits)[None, :, None] < valid[:, None, None]  # [T, S, 1]
  lse = jnp.where(mask, partial_lse, -jnp.inf)
  m = jnp.max(lse, axis=1, keepdims=True)  # [T, 1, H]; -inf when no valid split
  # lse == m gives weight 1 even for m = +inf (a +inf sink folded into split 0).
  w = jnp.where(mask, jnp.where(lse == m, 1.0, jnp.exp(lse - m)), 0.0)
  # A sum written out over the splits, not jnp.sum over axis 1: XLA:CPU compiles the reduction
  # over a middle axis of [T, S, H, 512] into a slow loop (26.7 against 1.6 ms at T 64, S 2; 121
  # against 11 at S 16, 2 cores), while the unrolled terms fuse into one vectorized pass.
  num = sum(jnp.where(mask[:, s, :, None], w[:, s, :, None] * partials[:, s], 0.0)
            for s in range(num_splits))
  den = jnp.sum(w, axis=1)  # [T, H]
  # Whether any split holds entries, not den > 0: a NaN in a used row makes den NaN, and the
  # sequence must come out NaN, not empty.
  has_split = jnp.broadcast_to((valid > 0)[:, None], den.shape)
  out = jnp.where(has_split[..., None], num / jnp.where(has_split, den, 1.0)[..., None], 0.0)
  lse_out = jnp.where(has_split, m[:, 0, :] + jnp.log(jnp.where(has_split, den, 1.0)),
                      sink.astype(jnp.float32)[None, :])
  return [out.astype(jnp.bfloat16), lse_out.astype(jnp.float32)]


merge_splits_p = Primitive("jax_mla_merge_splits")
merge_splits_p.multiple_results = True
merge_splits_p.def_impl(functools.partial(xla.apply_primitive, merge_splits_p))


@merge_splits_p.def_abstract_eval
def _merge_abstract_eval(partials, partial_lse, valid_split_count, kv_indptr, sink, *,
                         tokens_per_seq):
  del partial_lse, valid_split_count, kv_indptr, sink, tokens_per_seq
  t, _, h, _ = partials.shape
  return [jax.core.ShapedArray((t, h, layout.HEAD_DIM), jnp.bfloat16),
          jax.core.ShapedArray((t, h), jnp.float32)]


mlir.register_lowering(merge_splits_p, mlir.lower_fun(_merge_impl, multiple_results=True))
batching.primitive_batchers[merge_splits_p] = functools.partial(vmap_rules.merge_rule, _merge_impl)


def merge_splits(partials, partial_lse, valid_split_count, kv_indptr, sink, *, tokens_per_seq):
  """(out bf16 [T, H, 512], lse f32 [T, H]) from the kernel's S > 1 results."""
  return merge_splits_p.bind(partials, partial_lse, valid_split_count, kv_indptr, sink,
                             tokens_per_seq=int(tokens_per_seq))


# --- the function the public API calls -----------------------------------------------------------

def splits_for_lse(num_kv_splits: int) -> int:
  """The split count when the LSE comes from the split merge (not from the host executor, which
  merges its own splits): at least 2, since one split writes no LSE."""
  return max(2, num_kv_splits)


def _check_static(num_heads: int, tokens_per_seq, num_kv_splits, backend, return_lse,
                  fill_unwritten_nan, merge_in_executor):
  if isinstance(tokens_per_seq, bool) or not isinstance(tokens_per_seq, int):
    raise TypeError(f"tokens_per_seq must be an int, got {tokens_per_seq!r}")
  if num_kv_splits is not None:
    if isinstance(num_kv_splits, bool) or not isinstance(num_kv_splits, (int, np.integer)):
      raise TypeError(f"num_kv_splits must be an int or None, got {num_kv_splits!r}")
    if num_kv_splits < 1:
      raise ValueError(f"num_kv_splits must be >= 1, got {num_kv_splits}")
    if num_kv_splits == 1 and return_lse and not merge_in_executor:
      raise ValueError(
          "num_kv_splits=1 with return_lse=True: with one split the nm kernel writes the bf16 "
          "output directly and no LSE (whether it also writes one is undocumented, KERNELS.md "
          "section 3). Pass return_lse=False, or num_kv_splits >= 2.")
  if backend not in empty_rows.METHODS:
    raise ValueError(f"split_decode backend must be 'gfx950' or 'host', got {backend!r}")
  if fill_unwritten_nan and backend != "host":
    raise ValueError("fill_unwritten_nan=True is only available with backend='host'")
  if merge_in_executor and backend != "host":
    raise ValueError("merge_in_executor=True is only available with backend='host'")


def split_decode(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, *, tokens_per_seq: int,
                 num_kv_splits: int | None, backend: str, return_lse: bool = True,
                 fill_unwritten_nan: bool | None = None, kv_len_hint: int | None = None,
                 merge_in_executor: bool | None = None):
  """Decode through the nm kernel (backend 'gfx950') or its host executor (backend 'host').

  Arguments as `jax_mla.decode`, already validated there; sink is f32 [H] (-inf: no sink).
  num_kv_splits None picks with `planner.num_kv_splits` for gfx950 (at least 2 when return_lse)
  and `planner.host_num_kv_splits` for the host (the CPU's threads); kv_len_hint is passed to it.
  fill_unwritten_nan (host only, default True there) fills what the kernel does not write with
  NaN first, so a result never depends on it. merge_in_executor (host only, default True there)
  merges in the executor; False runs the gfx950 path's merge in XLA.

  Returns:
    (out bf16 [T, H, 512], lse f32 [T, H] with the sink included, or None).
  """
  # Sharded operands outside shard_map would be gathered onto every device: refuse them.
  guards.check_not_partitioned("decode", q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink)
  num_tokens, num_heads = q.shape[0], q.shape[1]
  num_seqs = kv_indptr.shape[0] - 1
  kernel_heads = PADDED_HEADS.get(num_heads, num_heads)
  if fill_unwritten_nan is None:
    fill_unwritten_nan = backend == "host"
  if merge_in_executor is None:
    merge_in_executor = backend == "host"
  _check_static(kernel_heads, tokens_per_seq, num_kv_splits, backend, return_lse,
                fill_unwritten_nan, merge_in_executor)
  if num_tokens != num_seqs * tokens_per_seq:
    raise ValueError(f"q has {num_tokens} tokens; expected num_seqs * tokens_per_seq = "
                     f"{num_seqs} * {tokens_per_seq}")
  if num_seqs == 0:
    out = jnp.zeros((0, num_heads, layout.HEAD_DIM), jnp.bfloat16)
    return out, (jnp.zeros((0, num_heads), jnp.float32) if return_lse else None)
  if num_kv_splits is None and backend == "host":  # the CPU's plan, not the MI355X's
    num_kv_splits = planner.host_num_kv_splits(num_seqs, kernel_heads, kv_len_hint=kv_len_hint)
  if num_kv_splits is None:
    num_kv_splits = planner.num_kv_splits(num_seqs, kernel_heads, kv_len_hint=kv_len_hint)
  if return_lse and not merge_in_executor:
    num_kv_splits = splits_for_lse(num_kv_splits)
  num_kv_splits = int(num_kv_splits)

  sink = jnp.asarray(sink, jnp.float32)
  if kernel_heads != num_heads:  # padded heads never see a sink
    pad = kernel_heads - num_heads
    q = jnp.pad(q, ((0, 0), (0, pad), (0, 0)))
    q_rope = jnp.pad(q_rope, ((0, 0), (0, pad), (0, 0)))
    sink = jnp.pad(sink, (0, pad), constant_values=-jnp.inf)
  seq_ids = jnp.arange(num_seqs + 1, dtype=jnp.int32)
  results = split_decode_p.bind(
      q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, seq_ids * tokens_per_seq,
      seq_ids * num_kv_splits, num_kv_splits=num_kv_splits, tokens_per_seq=int(tokens_per_seq),
      backend=backend, fill_unwritten_nan=bool(fill_unwritten_nan),
      merge_in_executor=bool(merge_in_executor))
  if merge_in_executor:
    out, lse = results[:2]
  elif num_kv_splits == 1:
    out, lse = empty_rows.fix(results[0], None, kv_indptr, sink, tokens_per_seq=tokens_per_seq,
                              method=empty_rows.METHODS[backend])
  else:
    partials, partial_lse, valid_split_count = results
    out, lse = merge_splits(partials, partial_lse, valid_split_count, kv_indptr, sink,
                            tokens_per_seq=tokens_per_seq)
  if kernel_heads != num_heads:
    out = out[:, :num_heads]
    lse = None if lse is None else lse[:, :num_heads]
  return out, (lse if return_lse else None)
