"""The public decode functions: every argument checked, the backend resolved once through the
registry (backends.py), then its entry point."""

from __future__ import annotations

import jax.numpy as jnp

from jax_mla._src import backends, checks, index_checks, layout


def decode(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink=None, *, tokens_per_seq: int = 1,
           num_kv_splits: int | None = None, backend: str = "auto", return_lse: bool = True,
           check_indices: bool = False):
  """DeepSeek-V4 fp8 MLA decode attention over packed rows (the split-plus-merge path).

  Args:
    q: uint8 `[T, H, 512]` packed query rows (`jax_mla.pack_rows`), `T = num_seqs *
      tokens_per_seq`; the tokens of a sequence are consecutive.
    q_rope: bf16 `[T, H, 64]`.
    kv: uint8 `[R, 512]` packed KV pool.
    kv_rope: bf16 `[R, 64]`.
    kv_indptr: int32 `[num_seqs + 1]`; sequence b attends to
      `kv_indices[kv_indptr[b]:kv_indptr[b + 1]]` (token-level rows of the pool, page size 1).
      `num_seqs` may be 0 (empty results, nothing launched).
    kv_indices: int32 `[L]`, at least `kv_indptr[-1]` entries; entries past it are never read.
    sink: optional f32 `[H]` attention-sink logits (join the softmax denominator only); `-inf`
      means no sink for that head, `+inf` gives an all-zero output.
    tokens_per_seq: query tokens per sequence (MTP); all attend to the same KV list.
    num_kv_splits: KV splits of the kernel backends; None picks one from the static shapes
      (`jax_mla.plan.num_kv_splits`; backend "pallas" plans its own grid). The reference
      ignores it (it does not split).
    backend: "auto", "gfx950", "host", "pallas" or "reference" (see the README's backend
      table; "auto" picks "pallas" on GPUs without verified gfx950 code objects).
    return_lse: whether to return the LSE. The gfx950 split kernel at one split writes bf16
      directly and no LSE, so with `return_lse=True` the gfx950 and host backends run at least
      2 splits (the pallas kernels write the LSE at any split count).
    check_indices: check on the device, before the launch, that kv_indptr is non-decreasing,
      starts at 0, ends <= len(kv_indices) and that every used index is in [0, R); violations
      report through `jax.experimental.checkify` (eagerly they raise; under jit wrap with
      `checkify.checkify`). See docs/contracts.md for the contract and its cost.

  Returns:
    `(out, lse)`: bf16 `[T, H, 512]` and f32 `[T, H]`, the natural log of the softmax
    denominator with the sink included (None when `return_lse=False`). A sequence without KV
    entries gives `out = 0` and `lse = sink` (`-inf` without one). The softmax scale is the
    kernels' fixed 1/sqrt(512).
  """
  dims = checks.check_decode_args(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink,
                                  tokens_per_seq=tokens_per_seq, num_kv_splits=num_kv_splits)
  checks.check_bool("return_lse", return_lse)
  checks.check_bool("check_indices", check_indices)
  entry = backends.resolve(backend)
  backends.check_layout(entry, entry.decode_layouts(), dims.num_heads, tokens_per_seq)
  if check_indices:
    kv_indptr = index_checks.checked_kv_indptr(kv_indptr, kv_indices, kv.shape[0],
                                               zero_start=True)
  sink = checks.as_sink(sink, dims.num_heads)
  if dims.num_tokens == 0:  # no sequences: nothing to launch
    return _empty_results(q, return_lse)
  args = [jnp.asarray(a) for a in (q, q_rope, kv, kv_rope, kv_indptr, kv_indices)]
  return entry.decode(*args, sink, tokens_per_seq=tokens_per_seq, num_kv_splits=num_kv_splits,
                      return_lse=return_lse)


def decode_persistent(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, workspace, *,
                      return_lse: bool = True, backend: str = "auto",
                      check_indices: bool = False):
  """DeepSeek-V4 fp8 MLA decode in one launch (AMD's persistent "nm_ps" kernel on gfx950).

  128 heads, one query token per row, `N <= min(32768, workspace.max_rows)` rows.

  Args:
    q: uint8 `[N, 128, 512]` packed query rows; q_rope: bf16 `[N, 128, 64]`.
    kv: uint8 `[R, 512]`; kv_rope: bf16 `[R, 64]`.
    kv_indptr: int32 `[N + 1]`; row r attends to `kv_indices[kv_indptr[r]:kv_indptr[r + 1]]`.
    kv_indices: int32 `[L]`.
    sink: f32 `[128]` or None (no sink).
    workspace: a `jax_mla.make_workspace(...)` pytree. Pass the returned one to the next call
      (calls sharing a workspace are ordered by that data dependence); donate it under jit so it
      is updated in place. After a failed call, `jax_mla.reset_workspace` it.
    return_lse: False skips the LSE (returned as None).
    backend: "auto", "gfx950", "host", "pallas" or "reference" (the last two compute the same
      result with their decode and return the workspace untouched).
    check_indices: as in `decode`, except that kv_indptr may start at an offset >= 0.

  Returns:
    `(out bf16 [N, 128, 512], lse f32 [N, 128] or None, workspace)`, with the same contracts as
    `decode`: lse is the natural log with the sink included; rows without KV entries give
    `out = 0` and `lse = sink`.
  """
  checks.check_bool("return_lse", return_lse)
  checks.check_bool("check_indices", check_indices)
  backends.check_backend_name(backend)
  if sink is None and hasattr(q, "shape") and len(q.shape) == 3:
    sink = checks.as_sink(None, q.shape[1])
  num_rows = checks.check_persistent_args(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink,
                                          workspace)
  entry = backends.resolve(backend)
  backends.check_layout(entry, entry.persistent_layouts(), q.shape[1], 1)
  if check_indices:
    kv_indptr = index_checks.checked_kv_indptr(kv_indptr, kv_indices, kv.shape[0],
                                               zero_start=False)
  if num_rows == 0:  # nothing to launch
    return (*_empty_results(q, return_lse), workspace)
  args = [jnp.asarray(a) for a in (q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink)]
  return entry.decode_persistent(*args, workspace, return_lse=return_lse)


def _empty_results(q, return_lse):
  num_heads = q.shape[1]
  out = jnp.zeros((0, num_heads, layout.HEAD_DIM), jnp.bfloat16)
  return out, (jnp.zeros((0, num_heads), jnp.float32) if return_lse else None)
