"""The public decode functions: every argument checked, the backend resolved once through the
registry (backends.py), then its entry point."""

from __future__ import annotations

import jax.numpy as jnp

from jax_mla._src import (adapters, backends, checks, forward_only, index_checks, layout,
                          sources)
from jax_mla._src.sources import KVSource


def decode(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink=None, *,
           extra: KVSource | None = None, softmax_scale: float | None = None,
           tokens_per_seq: int = 1, num_kv_splits: int | None = None, backend: str = "auto",
           return_lse: bool = True, check_indices: bool = False):
  """DeepSeek-V4 fp8 MLA decode attention (the split-plus-merge path).

  Args:
    q: the queries, `[T, H, 512]` with `T = num_seqs * tokens_per_seq` (the tokens of a
      sequence consecutive): uint8 packed rows (`jax_mla.pack_rows`) with q_rope bf16
      `[T, H, 64]`, or bf16/f32 values as the model holds them with `q_rope=None` (packed here
      for the backends whose kernels take fp8 rows; docs/contracts.md).
    q_rope: see q.
    kv, kv_rope, kv_indptr, kv_indices: the first KV source (`jax_mla.KVSource` documents the
      forms): a pool of uint8 packed rows `[R, 512]` + bf16 RoPE `[R, 64]`, or bf16/f32 rows
      `[R, 512]` with `kv_rope=None`; int32 `kv_indptr` `[num_seqs + 1]` (a list shared by the
      tokens of a sequence) or `[T + 1]` (a list per query token); int32 `kv_indices` `[L]`,
      token-level pool rows (page size 1; `jax_mla.pool_rows` maps page tables), entries past
      `kv_indptr[-1]` never read. `num_seqs` may be 0 (empty results, nothing launched).
    sink: optional f32 `[H]` attention-sink logits (join the softmax denominator only); `-inf`
      means no sink for that head, `+inf` gives an all-zero output.
    extra: optional second source (`jax_mla.KVSource`), e.g. the compressed cache's top-k beside
      the sliding window: the softmax runs over the union of both sources' entries, with one
      sink and one lse.
    softmax_scale: the score scale (a static float); None is the kernels' fixed 1/sqrt(512).
      Applied exactly by the reference and Pallas backends; folded into Q before packing for
      the gfx950 and host kernels (exact when `softmax_scale * sqrt(512)` is a power of two).
    tokens_per_seq: query tokens per sequence (MTP).
    num_kv_splits: KV splits of the kernel backends; None picks one from the static shapes
      (`jax_mla.plan.num_kv_splits`; backend "pallas" plans its own grid). The reference
      ignores it (it does not split).
    backend: "auto", "gfx950", "host", "pallas" or "reference" (see the README's backend
      table; "auto" picks "pallas" on GPUs without verified gfx950 code objects).
    return_lse: whether to return the LSE. The gfx950 split kernel at one split writes bf16
      directly and no LSE, so with `return_lse=True` the gfx950 backend runs at least 2 splits
      (the host, pallas and reference backends give the LSE at any split count).
    check_indices: check on the device, before the launch, that each kv_indptr is
      non-decreasing, starts at 0, ends <= len(kv_indices) and that every used index is in
      [0, R); violations report through `jax.experimental.checkify` (eagerly they raise; under
      jit wrap with `checkify.checkify`). See docs/contracts.md for the contract and its cost.

  Returns:
    `(out, lse)`: bf16 `[T, H, 512]` and f32 `[T, H]`, the natural log of the softmax
    denominator with the sink included (None when `return_lse=False`). A query token without KV
    entries gives `out = 0` and `lse = sink` (`-inf` without one).
  """
  dims = checks.check_decode_args(q, q_rope, sink, tokens_per_seq=tokens_per_seq,
                                  num_kv_splits=num_kv_splits)
  checks.check_softmax_scale(softmax_scale)
  checks.check_bool("return_lse", return_lse)
  checks.check_bool("check_indices", check_indices)
  if extra is not None and not isinstance(extra, KVSource):
    raise TypeError(f"extra must be a jax_mla.KVSource or None; got {type(extra).__name__}")
  given = [KVSource(kv, kv_rope, kv_indptr, kv_indices)] + ([] if extra is None else [extra])
  per_token = [sources.check_source(name, source, num_seqs=dims.num_seqs,
                                    tokens_per_seq=tokens_per_seq)
               for name, source in zip(("{}", "extra.{}"), given)]
  # Lists per query token run as one-token rows (sources.py).
  kernel_tokens = 1 if any(per_token) else tokens_per_seq
  entry = backends.resolve(backend)
  backends.check_layout(entry, entry.decode_layouts(), dims.num_heads, kernel_tokens)
  given = [KVSource(*(None if a is None else jnp.asarray(a) for a in source))
           for source in given]
  if check_indices:
    given = [source._replace(kv_indptr=index_checks.checked_kv_indptr(
        source.kv_indptr, source.kv_indices, source.kv.shape[0], zero_start=True))
             for source in given]
  sink = checks.as_sink(sink, dims.num_heads)
  if dims.num_tokens == 0:  # no sequences: nothing to launch
    return _empty_results(q, return_lse)
  if kernel_tokens != tokens_per_seq:
    given = [source if pt else adapters.per_token_source(source, tokens_per_seq)
             for source, pt in zip(given, per_token)]
  q = jnp.asarray(q)
  q_rope = None if q_rope is None else jnp.asarray(q_rope)
  return _run(entry, q, q_rope, given, sink, tokens_per_seq=kernel_tokens,
              num_kv_splits=num_kv_splits, return_lse=return_lse, softmax_scale=softmax_scale)


def _run(entry, q, q_rope, given, sink, *, tokens_per_seq, num_kv_splits, return_lse,
         softmax_scale):
  """Calls `entry.decode`, doing first what the backend does not take natively (adapters.py)."""
  native = entry.native
  if "float_kv" not in native:
    given = [adapters.packed_source(source) for source in given]
  fold = "softmax_scale" not in native and not adapters.is_kernel_scale(softmax_scale)
  if fold or (q_rope is None and "float_q" not in native):
    q, q_rope = adapters.packed_query(q, q_rope, softmax_scale if fold else None)
  options = {}
  if not fold and not adapters.is_kernel_scale(softmax_scale):
    options["softmax_scale"] = float(softmax_scale)
  def call(source, sink, extra=None, **kw):
    def run(q, q_rope, source, sink, extra):
      return entry.decode(q, q_rope, *source, sink, tokens_per_seq=tokens_per_seq,
                          num_kv_splits=num_kv_splits, **options, **kw,
                          **({} if extra is None else {"extra": extra}))
    return forward_only.call(entry, run, q, q_rope, source, sink, extra)
  if len(given) == 1:
    return call(given[0], sink, return_lse=return_lse)
  if "extra" in native:
    return call(given[0], sink, return_lse=return_lse, extra=given[1])
  if num_kv_splits == 1 and not entry.lse_at_one_split:
    raise ValueError(
        f"num_kv_splits=1 with extra=: backend={entry.name!r} runs one decode per source and "
        "merges them by their lse, which its kernel writes from 2 splits on; pass None or >= 2")
  no_sink = adapters.no_sink(sink.shape[0])
  out, lse = adapters.merge_by_lse([call(source, no_sink, return_lse=True) for source in given],
                                   sink)
  return out, (lse if return_lse else None)


def decode_persistent(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, workspace, *,
                      softmax_scale: float | None = None, return_lse: bool = True,
                      backend: str = "auto", check_indices: bool = False, extra=None):
  """DeepSeek-V4 fp8 MLA decode in one launch (AMD's persistent "nm_ps" kernel on gfx950).

  128 heads, one query token per row, `N <= min(32768, workspace.max_rows)` rows.

  Args:
    q: `[N, 128, 512]`: uint8 packed rows with q_rope bf16 `[N, 128, 64]`, or bf16/f32 values
      with `q_rope=None` (packed here).
    kv, kv_rope: the pool: uint8 `[R, 512]` + bf16 `[R, 64]`, or bf16/f32 `[R, 512]` with
      `kv_rope=None` (the rows the lists name are packed here).
    kv_indptr: int32 `[N + 1]`; row r attends to `kv_indices[kv_indptr[r]:kv_indptr[r + 1]]`.
    kv_indices: int32 `[L]`.
    sink: f32 `[128]` or None (no sink).
    workspace: a `jax_mla.make_workspace(...)` pytree. Pass the returned one to the next call
      (calls sharing a workspace are ordered by that data dependence); donate it under jit so it
      is updated in place. After a failed call, `jax_mla.reset_workspace` it.
    softmax_scale: as in `decode`; every backend folds it into Q before packing (the nm_ps
      kernel's scale is fixed).
    return_lse: False skips the LSE (returned as None).
    backend: "auto", "gfx950", "host", "pallas" or "reference" (the last two compute the same
      result with their decode and return the workspace untouched).
    check_indices: as in `decode`, except that kv_indptr may start at an offset >= 0.
    extra: not supported: the nm_ps kernel reads one pool. Use `decode(..., extra=...)`.

  Returns:
    `(out bf16 [N, 128, 512], lse f32 [N, 128] or None, workspace)`, with the same contracts as
    `decode`: lse is the natural log with the sink included; rows without KV entries give
    `out = 0` and `lse = sink`.
  """
  if extra is not None:
    raise ValueError("decode_persistent takes one KV source: AMD's nm_ps kernel reads one pool "
                     "and plans its splits over it. For a second source use "
                     "jax_mla.decode(..., extra=...), which merges the two by their lse.")
  checks.check_bool("return_lse", return_lse)
  checks.check_bool("check_indices", check_indices)
  checks.check_softmax_scale(softmax_scale)
  backends.check_backend_name(backend)
  num_rows, num_heads = checks.check_query(q, q_rope)
  if sink is None:
    sink = checks.as_sink(None, num_heads)
  sources.check_source("{}", KVSource(kv, kv_rope, kv_indptr, kv_indices), num_seqs=num_rows,
                       tokens_per_seq=1)
  source = KVSource(*(None if a is None else jnp.asarray(a)
                      for a in (kv, kv_rope, kv_indptr, kv_indices)))
  if check_indices:  # on the lists as given, before a bf16 pool's rows are packed
    source = source._replace(kv_indptr=index_checks.checked_kv_indptr(
        source.kv_indptr, source.kv_indices, source.kv.shape[0], zero_start=False))
  kv, kv_rope, kv_indptr, kv_indices = adapters.packed_source(source)
  if q_rope is None or not adapters.is_kernel_scale(softmax_scale):
    q, q_rope = adapters.packed_query(jnp.asarray(q), None if q_rope is None
                                      else jnp.asarray(q_rope), softmax_scale)
  # Q and the source are checked above; the packing keeps what those checks hold.
  checks.check_persistent_rest(num_rows, num_heads, sink, workspace)
  entry = backends.resolve(backend)
  backends.check_layout(entry, entry.persistent_layouts(), q.shape[1], 1)
  if num_rows == 0:  # nothing to launch
    return (*_empty_results(q, return_lse), workspace)
  args = [jnp.asarray(a) for a in (q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink)]
  run = lambda *args: entry.decode_persistent(*args, return_lse=return_lse)
  return forward_only.call(entry, run, *args, workspace)


def _empty_results(q, return_lse):
  num_heads = q.shape[1]
  out = jnp.zeros((0, num_heads, layout.HEAD_DIM), jnp.bfloat16)
  return out, (jnp.zeros((0, num_heads), jnp.float32) if return_lse else None)
