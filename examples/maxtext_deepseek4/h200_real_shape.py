"""DeepSeek-V4 attention decode at the real layer shape through jax_mla: error and timing.

    PYTHONPATH=src python examples/maxtext_deepseek4/h200_real_shape.py            # on the H200
    PYTHONPATH=src python examples/maxtext_deepseek4/h200_real_shape.py --batch 2 --context 1024

The shape is DeepSeek-V4-Flash's attention layer (MaxText's deepseek4-284b.yml): 64 query heads,
head_dim 512 (RoPE 64), one latent KV head, a sliding window of 128, CSA layers (compression 4,
the indexer's top-512) and HCA layers (compression 128, every block), per-head sinks. Each sequence
of the batch has its own context length (uniform in [context / 2, context]).

core (always; no MaxText needed): the integration's caches (cache.py: a packed fp8 window ring and
  a packed compressed pool, rows written with jax_mla.update_cache) and its two index lists, with
  random values shaped like MaxText's (unit-RMS K rows, Q with head_dim ** -0.5 folded in, N(0, 1)
  sinks). Prints, per layer type:
    error: jax_mla.decode(..., extra=, softmax_scale=1.0) against a float32 dense softmax over the
      same rows: on the fp8 rows with Q as given (bf16: what the reference and pallas backends
      read), on the fp8 rows with Q packed to fp8 after the scale fold (what host and gfx950
      read), and on the unquantized values (the cache's fp8 error included);
    time: the two-source decode; one source holding the same entries (both pools in one, one
      list); a whole decode step (the new token's rows written, the lists built, the decode),
      jitted with the caches donated. GPU busy time from a profiler trace where there is a GPU
      (benchmarks/timing), else the host clock; medians.
layer (when maxtext is importable; --no-layer skips it): MaxText's CompressedAttention at that
  shape (bf16 activations) through JaxMlaV4Decoder: time per step, and its output against the
  same decoder with unquantized bf16 caches on the reference backend.

Flags: --batch, --context, --steps, --backend (jax_mla's; default auto), --reps.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))                     # examples/: maxtext_deepseek4
sys.path.insert(0, str(HERE.parent.parent / "benchmarks"))  # the timing library

import jax_mla  # noqa: E402  pylint: disable=wrong-import-position
from maxtext_deepseek4 import cache as pools  # noqa: E402  pylint: disable=wrong-import-position

HEADS, WINDOW, TOPK, CSA, HCA = 64, 128, 512, 4, 128


def timer():
  """(name, time_us(run, calls)): GPU busy time where a GPU is, else host wall time."""
  if jax.default_backend() == "gpu":
    try:
      from timing import device_time  # pylint: disable=import-outside-toplevel
      return "GPU busy time (profiler)", device_time.device_time_us
    except ImportError:
      pass

  def wall_us(run, calls):
    start = time.perf_counter()
    run()
    return (time.perf_counter() - start) * 1e6 / calls
  return "host wall clock", wall_us


def median_us(time_us, fn, args, *, calls=10, reps=5):
  jax.block_until_ready(fn(*args))   # compile

  def run():
    out = None
    for _ in range(calls):
      out = fn(*args)
    jax.block_until_ready(out)
  return statistics.median(time_us(run, calls) for _ in range(reps))


def rows_f32(source: jax_mla.KVSource, rows):
  if source.kv_rope is None:
    return source.kv[rows].astype(jnp.float32)
  return jax_mla.unpack_rows(source.kv[rows], source.kv_rope[rows])


def dense_attention(q, sink, sources, values=None):
  """float32 softmax over the union of the sources' lists (shared lists, [B + 1] indptr, as
  KVSource.from_topk builds them), with the sink, scale 1: out [B, H, 512]. `values`: per source,
  f32 rows to read instead of the pool's (the unquantized values)."""
  logits, rows_all = [], []
  for i, s in enumerate(sources):
    b = s.kv_indptr.shape[0] - 1
    width = s.kv_indices.shape[0] // b
    j = jnp.arange(width)[None, :]
    used = j < (s.kv_indptr[1:] - s.kv_indptr[:-1])[:, None]
    at = jnp.clip(s.kv_indptr[:-1, None] + j, 0, s.kv_indices.shape[0] - 1)
    idx = jnp.where(used, s.kv_indices[at], 0)
    rows = rows_f32(s, idx) if values is None else values[i][idx]      # [B, width, 512]
    lg = jnp.einsum("bhd,bnd->bhn", q.astype(jnp.float32), rows,
                    precision=jax.lax.Precision.HIGHEST)
    logits.append(jnp.where(used[:, None, :], lg, -jnp.inf))
    rows_all.append(rows)
  lg = jnp.concatenate(logits, axis=-1)
  top = jnp.maximum(jnp.max(lg, axis=-1), sink[None, :])
  p = jnp.exp(lg - top[..., None])
  denom = jnp.sum(p, axis=-1) + jnp.exp(sink[None, :] - top)
  out = jnp.einsum("bhn,bnd->bhd", p, jnp.concatenate(rows_all, axis=1),
                   precision=jax.lax.Precision.HIGHEST)
  return out / denom[..., None]


def rel_l2(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def one_source(window: jax_mla.KVSource, extra: jax_mla.KVSource, window_rows, comp_local,
               comp_rows):
  """Both pools in one and one list per sequence holding the same entries (for timing)."""
  kv = jnp.concatenate([window.kv, extra.kv])
  rope = jnp.concatenate([window.kv_rope, extra.kv_rope])
  offset = window.kv.shape[0]
  comp = jnp.where(comp_local >= 0, pools.pool_rows(comp_local, comp_rows) + offset, -1)
  return jax_mla.KVSource.from_topk(kv, rope, jnp.concatenate([window_rows, comp], axis=1))


def core(args, time_us):
  print(f"\n== core: batch {args.batch}, contexts in [{args.context // 2}, {args.context}], "
        f"{HEADS} heads, window {WINDOW}, backend {args.backend}")
  key = jax.random.key(0)
  b = args.batch
  lengths = jax.random.randint(jax.random.fold_in(key, 1), (b,), args.context // 2,
                               args.context + 1).astype(jnp.int32)
  positions = lengths - 1     # the query token is the last one cached
  sink = jax.random.normal(jax.random.fold_in(key, 2), (HEADS,), jnp.float32)
  # MaxText's Q: unit-RMS rows with head_dim ** -0.5 folded in.
  q = jax.random.normal(jax.random.fold_in(key, 3), (b, HEADS, 512), jnp.float32) / math.sqrt(512)
  q = q.astype(jnp.bfloat16)
  for name, ratio in (("CSA", CSA), ("HCA", HCA)):
    comp_rows = args.context // ratio
    # The values: unit-RMS rows, as MaxText's kv_norm leaves them.
    win_x = jax.random.normal(jax.random.fold_in(key, 10 + ratio), (b * WINDOW, 512))
    comp_x = jax.random.normal(jax.random.fold_in(key, 20 + ratio), (b * comp_rows, 512))
    win_kv, win_rope = pools.empty_pool(b * WINDOW, "fp8")
    comp_kv, comp_rope = pools.empty_pool(b * comp_rows, "fp8")
    win_kv, win_rope = pools.write_rows(win_kv, win_rope, win_x,
                                        jnp.arange(b * WINDOW, dtype=jnp.int32))
    comp_kv, comp_rope = pools.write_rows(comp_kv, comp_rope, comp_x,
                                          jnp.arange(b * comp_rows, dtype=jnp.int32))
    window = pools.window_source(win_kv, win_rope, positions, window=WINDOW, slots=WINDOW)
    num_blocks = lengths // ratio
    if ratio == CSA:   # the indexer's scores stand in as random numbers
      scores = jax.random.normal(jax.random.fold_in(key, 30), (b, comp_rows))
      comp_local = pools.topk_blocks(scores, num_blocks, TOPK)
    else:
      comp_local = pools.all_blocks(num_blocks, comp_rows)
    extra = pools.compressed_source(comp_kv, comp_rope, comp_local, comp_rows)

    decode = jax.jit(lambda q, w, e: pools.attend(q, sink, w, e, backend=args.backend))
    out = decode(q, window, extra)
    # The fp8 Q the host and gfx950 backends read: Q with the scale folded in (x sqrt(512)), packed.
    q_fp8 = jax_mla.unpack_rows(*jax_mla.pack_rows(q.astype(jnp.float32) * math.sqrt(512)))
    kernel = dense_attention(q_fp8 / math.sqrt(512), sink, [window, extra])
    deq = dense_attention(q, sink, [window, extra])
    raw = dense_attention(q, sink, [window, extra], values=[win_x, comp_x])
    entries = int(window.kv_indptr[-1] + extra.kv_indptr[-1]) / b
    print(f"{name} (ratio {ratio}): {entries:.0f} entries per sequence on average "
          f"({int(window.kv_indptr[-1]) / b:.0f} window + {int(extra.kv_indptr[-1]) / b:.0f} "
          f"compressed)")
    print(f"  error vs float32 dense softmax, rel-L2: {rel_l2(out, deq):.2e} on the fp8 rows with "
          f"Q as given (reference, pallas read it), {rel_l2(out, kernel):.2e} with Q packed to "
          f"fp8 (host, gfx950 read that), {rel_l2(out, raw):.2e} on the unquantized values")

    key_pos = positions[:, None] - jnp.arange(WINDOW)[None, :]
    win_local = jnp.where(key_pos >= 0, key_pos % WINDOW, -1)
    single = one_source(window, extra, pools.pool_rows(win_local, WINDOW), comp_local, comp_rows)
    decode_one = jax.jit(lambda q, s: pools.attend(q, sink, s, None, backend=args.backend))
    out_one = decode_one(q, single)
    two = median_us(time_us, decode, (q, window, extra), reps=args.reps)
    one = median_us(time_us, decode_one, (q, single), reps=args.reps)
    print(f"  decode, two sources: {two:9.1f} us   one source, same entries: {one:9.1f} us "
          f"({100 * (two / one - 1):+.1f} %; outputs agree to rel-L2 {rel_l2(out, out_one):.1e})")

    def step(win_kv, win_rope, comp_kv, comp_rope, q, new_rows, new_blocks, positions, scores):
      """One step of the whole integration: write each sequence's new token (and a completed
      block) with update_cache, build both lists, decode."""
      seq = jnp.arange(b, dtype=jnp.int32)
      win_kv, win_rope = pools.write_rows(win_kv, win_rope, new_rows,
                                          seq * WINDOW + positions % WINDOW)
      done = (positions + 1) % ratio == 0
      block = (positions + 1) // ratio - 1
      comp_kv, comp_rope = pools.write_rows(comp_kv, comp_rope, new_blocks,
                                            jnp.where(done, seq * comp_rows + block, -1))
      window = pools.window_source(win_kv, win_rope, positions, window=WINDOW, slots=WINDOW)
      blocks = jnp.minimum((positions + 1) // ratio, comp_rows)
      local = (pools.topk_blocks(scores, blocks, TOPK) if ratio == CSA
               else pools.all_blocks(blocks, comp_rows))
      extra = pools.compressed_source(comp_kv, comp_rope, local, comp_rows)
      out = pools.attend(q, sink, window, extra, backend=args.backend)
      return out, win_kv, win_rope, comp_kv, comp_rope

    step = jax.jit(step, donate_argnums=(0, 1, 2, 3))
    new_rows = jax.random.normal(jax.random.fold_in(key, 40), (b, 512))
    state = [win_kv, win_rope, comp_kv, comp_rope]

    def step_once(q, new_rows, new_blocks, positions, scores):
      out, *rest = step(*state, q, new_rows, new_blocks, positions, scores)
      state[:] = rest
      return out
    step_us = median_us(time_us, step_once, (q, new_rows, new_rows, positions,
                                             jax.random.normal(key, (b, comp_rows))),
                        reps=args.reps)
    print(f"  whole step (update_cache + lists + decode, caches donated): {step_us:9.1f} us")


def layer_part(args, time_us):
  try:
    from maxtext.common.common_types import MODEL_MODE_TRAIN  # pylint: disable=import-outside-toplevel
    from maxtext_deepseek4 import decoder, model  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    print(f"\n== layer: skipped, MaxText is not importable ({e!r}); see docs/maxtext.md")
    return
  b, context = args.batch, args.context
  print(f"\n== layer: MaxText CompressedAttention at the real shape, batch {b}, prompt {context}, "
        f"{args.steps} decode steps")
  cfg = model.config(max_prefill=context, max_target=context + args.steps, dtype="bfloat16",
                     batch=b, **model.REAL_SHAPE)
  the_mesh = model.mesh(cfg)
  x = jax.random.normal(jax.random.key(5), (b, context + args.steps, cfg.emb_dim), jnp.bfloat16)
  for name, ratio in (("CSA", CSA), ("HCA", HCA)):
    with jax.set_mesh(the_mesh):
      layer = model.layer(cfg, the_mesh, compress_ratio=ratio, model_mode=MODEL_MODE_TRAIN,
                          batch=b)
      model.randomize(layer, seed=ratio)
      outs = {}
      for kv_format, backend in (("fp8", args.backend), ("bf16", "reference")):
        dec = decoder.JaxMlaV4Decoder(layer, batch=b, max_length=context + args.steps,
                                      kv_format=kv_format, backend=backend)
        cache = dec.prefill(dec.init_cache(), x[:, :context])
        steps, times = [], []
        for p in range(context, context + args.steps):
          start = time.perf_counter()
          out, cache = dec.step(cache, x[:, p:p + 1])
          jax.block_until_ready(out)
          times.append((time.perf_counter() - start) * 1e6)
          steps.append(out)
        outs[kv_format] = steps
        if kv_format == "fp8":
          print(f"{name}: decode step (projections, compression, indexer, jax_mla) "
                f"{statistics.median(times[1:]):.0f} us host wall clock (median of "
                f"{len(times) - 1} after the first)")
      errors = [rel_l2(a, r) for a, r in zip(outs["fp8"], outs["bf16"])]
      print(f"  layer output, fp8 caches on {args.backend} vs bf16 caches on the reference: "
            f"rel-L2 max {max(errors):.2e} over {len(errors)} steps")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--context", type=int, default=8192)
  parser.add_argument("--steps", type=int, default=8)
  parser.add_argument("--backend", default="auto")
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--no-layer", action="store_true")
  args = parser.parse_args()
  how, time_us = timer()
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; jax_mla backend "
        f"{args.backend}; times: {how}")
  core(args, time_us)
  if not args.no_layer:
    layer_part(args, time_us)


if __name__ == "__main__":
  main()
