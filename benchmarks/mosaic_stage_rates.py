"""How fast each stage of the Mosaic decode kernel runs alone. Needs an sm90 GPU.

Usage: python benchmarks/mosaic_stage_rates.py [--stages qk_split,qk_full,pv,dequant,softmax]

The profile of the whole staged-design kernel (mosaic_profile.py, removed with it) put about 3.4 us per 64-entry step in QK,
which is 64 x 32 x 512 per consumer, about 0.3 us at the tensor cores' rate. This script runs
each stage alone, in a kernel shaped like the decode's (one CTA per SM, two consumer
warpgroups, the same shared-memory tiles and swizzle), `reps` times in a loop, and reports
microseconds per repetition: the time at 2 * R repetitions minus the time at R, over R, so the
launch and the prologue cancel. Shared memory is not initialized: the stages' speed does not
depend on the values (NaNs included).

Stages (each per consumer warpgroup, both at once):
- qk_split: S [64, 32] = Q [64, 512] K[32 entries]^T (the default's split_qk).
- qk_full: S [64, 64] = Q K^T (duplicated_qk).
- pv: O [64, 256] += P [64, 64] (bf16, registers) V [64, 256].
- dequant: 4 tiles of [64, 64] fp8 loaded from the staged rows (the UPCAST layout), scaled,
  stored as bf16 into the K tile (the kernel's dequantize_tile without the validity mask).
- softmax: the online softmax of a [64, 64] f32 S (max, exp2, sums, O rescale).
- chain: dequant, qk_full, softmax and pv one after another (no barriers between the two
  consumers, whose results are garbage).
- chain_scales: chain with the kernel's tile-scale reads from the staged rows and its
  validity mask.
- chain_synced: chain with the kernel's barrier between the two consumers after dequant (both
  wait for both halves of K), which keeps them in step.
- gather: one warpgroup per CTA gathers and dequantizes a block of 64 random rows of a
  65536-row pool (--pool-rows) from global memory into the K tile (mosaic_gather), which the
  direct design's producer does per step. gather_unconverted: its loads and stores without the
  dequantization (wrong values).

The other stages are the staged design's (removed on 2026-12-03; benchmarks/NOTES-pallas.md).
"""

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jax_mla._src import mosaic_gather

ROWS, KV, HALF, TILE = 64, 64, 256, 64
STAGES = ("qk_split", "qk_full", "pv", "dequant", "softmax", "chain", "chain_scales",
          "chain_synced", "gather", "gather_unconverted")
GATHERS = {"gather": "f32", "gather_unconverted": "none"}  # mosaic_gather's math
POOL = 65536


def stage_kernel(stage, reps, num_ctas):
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  wgmma_layout = plgpu.Layout.WGMMA
  upcast = plgpu.Layout.WGMMA_UPCAST_4X
  swizzled = mosaic_gather.k_tile_transforms()

  def body(out_ref, q_smem, k_smem, raw_smem, sync_bar):
    wg = lax.axis_index("wg")

    def qk(entries, acc_ref):
      for h in range(2):
        k = k_smem.at[h] if entries is None else k_smem.at[h, entries]
        plgpu.wgmma(acc_ref, q_smem.at[h], k.T)
      return acc_ref[...]

    def dequant(m, scales):
      for t in range(4):
        raw = plgpu.load(raw_smem.at[:, pl.ds(TILE * t, TILE)], (), layout=upcast,
                         optimized=False)
        vals = lax.bitcast_convert_type(raw, jnp.float8_e4m3fn).astype(jnp.float32)
        scale = m if scales is None else scales[t]
        vals = vals * plgpu.layout_cast(lax.broadcast_in_dim(scale, (KV, TILE), [0]), upcast)
        if scales is not None:
          valid = plgpu.layout_cast(lax.broadcast_in_dim(m, (KV, TILE), [0]), upcast) > -1e30
          vals = jnp.where(valid, vals, 0.0)
        k_smem[wg, :, pl.ds(TILE * t, TILE)] = vals.astype(jnp.bfloat16)
      plgpu.commit_smem()

    def tile_scales():
      ref = raw_smem.at[:, pl.ds(448, 16)]
      low = plgpu.load(ref, (), layout=wgmma_layout, optimized=False).astype(jnp.int32)
      col = plgpu.broadcasted_iota(jnp.int32, (KV, 16), 1, layout=wgmma_layout)
      return [jnp.where(col == 2 * t, low, 0).sum(axis=1).astype(jnp.float32)
              for t in range(4)]

    def scores(n):
      entries = pl.ds(wg * n, n) if n < KV else None
      return pl.run_scoped(functools.partial(qk, entries), plgpu.ACC((ROWS, n), jnp.float32))

    def softmax(s, acc, m):
      m_new = jnp.maximum(m, s.max(axis=1))
      alpha = jnp.exp2(m - m_new)
      p = jnp.exp2(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
      m = m_new + p.sum(axis=1) * 1e-6
      return p, acc * lax.broadcast_in_dim(alpha, acc.shape, [0]), m

    def pv(p, acc):
      def run(acc_ref):
        plgpu.wgmma(acc_ref, p.astype(jnp.bfloat16), k_smem.at[wg])
      return pl.run_state(run)(plgpu.ACC.init(acc))

    def step(i, carry):
      acc, m = carry
      if stage in ("qk_split", "qk_full"):
        s = scores(KV // 2 if stage == "qk_split" else KV)
        m = m + s.max(axis=1)
      elif stage == "pv":
        acc = pv(plgpu.layout_cast(jnp.full((ROWS, KV), 1.0, jnp.float32), wgmma_layout), acc)
      elif stage == "dequant":
        dequant(m, None)
      elif stage == "softmax":
        s = plgpu.layout_cast(jnp.full((ROWS, KV), 0.5, jnp.float32), wgmma_layout)
        s = s + lax.broadcast_in_dim(m, s.shape, [0]) * 1e-3
        _, acc, m = softmax(s, acc, m)
      else:  # chain, chain_scales, chain_synced
        dequant(m, tile_scales() if "scales" in stage else None)
        if stage == "chain_synced":
          plgpu.barrier_arrive(sync_bar)
          plgpu.barrier_wait(sync_bar)
        p, acc, m = softmax(scores(KV), acc, m)
        acc = pv(p, acc)
      return acc, m

    acc = plgpu.layout_cast(jnp.zeros((ROWS, HALF), jnp.float32), wgmma_layout)
    m = plgpu.layout_cast(jnp.zeros((ROWS,), jnp.float32), wgmma_layout.reduce(1))
    acc, m = lax.fori_loop(0, reps, step, (acc, m))
    cta = lax.axis_index("cta")
    # One value per CTA and warpgroup keeps every stage's result alive.
    out_ref[cta, wg] = (acc.sum(axis=1) + m).sum()

  scratch = dict(
      q_smem=plgpu.SMEM((2, ROWS, HALF), jnp.bfloat16, transforms=swizzled),
      k_smem=plgpu.SMEM((2, KV, HALF), jnp.bfloat16, transforms=swizzled),
      raw_smem=plgpu.SMEM((KV, 512), jnp.uint8),
      sync_bar=plgpu.Barrier(num_arrivals=2),
  )
  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((num_ctas, 2), jnp.float32),
                      scratch_types=scratch, grid=(num_ctas,), grid_names=("cta",),
                      num_threads=2, thread_name="wg",
                      compiler_params=plgpu.CompilerParams(approx_math=True))


def gather_kernel(reps, num_ctas, pool_rows=POOL, math="f32"):
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  mg = mosaic_gather

  def body(kv_ref, rope_ref, idx_ref, out_ref, k_smem):
    cta = lax.axis_index("cta")

    @pl.loop(0, reps)
    def _block(i):
      block = lax.rem(i * num_ctas + cta, reps)
      mg.gather_dequantize(kv_ref, rope_ref, idx_ref.at[pl.ds(block * 64, 64)],
                           jnp.int32(64), k_smem, math=math)
      plgpu.commit_smem()
    for h in range(2):
      plgpu.copy_smem_to_gmem(k_smem.at[h], out_ref.at[cta, h])
    plgpu.wait_smem_to_gmem(0)

  kernel = plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((num_ctas, 2, 64, HALF), jnp.bfloat16),
      scratch_types=dict(k_smem=plgpu.SMEM((2, 64, HALF), jnp.bfloat16,
                                           transforms=mg.k_tile_transforms())),
      grid=(num_ctas,), grid_names=("cta",))
  key = jax.random.key(0)
  kv = jax.random.randint(key, (pool_rows, 512), 0, 120, jnp.int32).astype(jnp.uint8)
  rope = jnp.zeros((pool_rows, 64), jnp.bfloat16)
  idx = jax.random.randint(key, (reps * 64,), 0, pool_rows, jnp.int32)
  return jax.jit(kernel), (kv, rope, idx)


def time_us(f, rounds=7):
  f().block_until_ready()
  samples = []
  for _ in range(rounds):
    t0 = time.perf_counter()
    f().block_until_ready()
    samples.append((time.perf_counter() - t0) * 1e6)
  return statistics.median(samples)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--stages", default=",".join(STAGES))
  ap.add_argument("--reps", type=int, default=512)
  ap.add_argument("--pool-rows", type=int, default=POOL,
                  help="the gather's pool; 65536 rows (40 MB) stay in the H200's L2, 2^20 do not")
  a = ap.parse_args()
  num_ctas = jax.devices()[0].core_count
  print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}, {num_ctas} CTAs x 2 "
        f"consumer warpgroups, R = {a.reps}")
  print("| stage | us per repetition | us at R | us at 2R |\n|---|---|---|---|")
  for stage in a.stages.split(","):
    if stage in GATHERS:
      (f1, args1) = gather_kernel(a.reps, num_ctas, a.pool_rows, GATHERS[stage])
      (f2, args2) = gather_kernel(2 * a.reps, num_ctas, a.pool_rows, GATHERS[stage])
      one, two = lambda: f1(*args1), lambda: f2(*args2)
    else:
      one = jax.jit(stage_kernel(stage, a.reps, num_ctas))
      two = jax.jit(stage_kernel(stage, 2 * a.reps, num_ctas))
    t1, t2 = time_us(one), time_us(two)
    print(f"| {stage} | {(t2 - t1) / a.reps:.3f} | {t1:.1f} | {t2:.1f} |", flush=True)


if __name__ == "__main__":
  main()
