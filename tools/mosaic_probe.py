"""Probes of Mosaic GPU operations the fp8 decode kernel builds on or might, each checked exactly
against numpy, each in its own process (a fault on the GPU poisons its CUDA context). Needs an
sm90 GPU; with --lower-only it only lowers each probe for CUDA (any machine).

Why: the staged design's dequantization (removed on 2026-12-03) loaded staged rows whose 512-byte pitch puts every row on the
same shared-memory banks (8-way conflicts). Padding the rows to PITCH bytes removes that, but the
padded kernel faulted on the GPU; these probes narrow down which operation does it.

Each probe is one warpgroup:
- copied_rows: 64 bulk copies of 512-byte rows into SMEM rows of pitch PITCH, copied out whole.
- wgmma_padded / upcast_padded: one bulk copy fills a [64, PITCH] u8 buffer; a 32-column piece
  is loaded in the WGMMA / WGMMA_UPCAST_4X layout. upcast_unpadded: the same at pitch 512.
- upcast_fp8_filled / wgmma_fp8_filled: the same, the piece converted fp8 -> f32.
- upcast_rows_int: copied_rows' copies, then upcast_padded's load.
- fp8_piece: copied_rows' copies, then an UPCAST load converted fp8 -> f32 (the kernel's step).
- rope_piece: the same for bf16 RoPE rows at pitch 96.
- row_bcast: an f32 [64] row vector broadcast to [64, 32] in the UPCAST layout.
- store_piece: a [64, 32] bf16 piece in the UPCAST layout stored into a 64-byte swizzled
  [64, 256] K tile at column 96, the tile copied out whole.
- idx_tma_only / idx_tma: a TMA of 64 int32 indices at a dynamic offset into slot 1 of a [2, 64]
  SMEM buffer, copied out / read back as scalars.

On the GPU (H100 and H200, jax 0.11.2, 2026-12-02): exact were copied_rows, wgmma_padded,
upcast_padded, upcast_unpadded, upcast_fp8_filled, wgmma_fp8_filled, row_bcast and store_piece.
upcast_rows_int, fp8_piece and rope_piece failed with CUDA_ERROR_MISALIGNED_ADDRESS; idx_tma_only
and idx_tma with CUDA_ERROR_ILLEGAL_INSTRUCTION. So a load from a padded buffer filled by row
copies faults, while either alone works. Unexplained.
"""

import argparse
import functools
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

UPCAST = plgpu.Layout.WGMMA_UPCAST_4X
PIECE = 32
PITCH = 512 + PIECE  # a padded row pitch: 8 rows' 8-byte loads start 8 banks apart


def kernel(body, out_shape, out_dtype, scratch=None):
  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(out_shape, out_dtype),
                      scratch_types=scratch or {})


def staged(rows, pitch, *, by_rows, first=None, layout=UPCAST, to_float=False):
  """Stage `rows` [64, width] in an SMEM buffer [64, pitch]: one bulk copy per row (by_rows) or
  one for the whole array (width == pitch). Then read back either the piece [:, first:first +
  32], loaded in `layout` (fp8 converted to f32 if to_float, else the values as f32), or, with
  first None, the whole buffer by a TMA."""
  width = rows.shape[1]
  piece = first is not None

  def body(r_ref, o_ref, smem, bar):
    copy = functools.partial(plgpu.copy_gmem_to_smem, barrier=bar,
                             oob_mode=plgpu.OOBFillMode.PROMISE_IN_BOUNDS)
    if by_rows:
      for j in range(64):
        copy(r_ref.at[pl.ds(j, 1)], smem.at[pl.ds(j, 1), pl.ds(0, width)])
    else:
      copy(r_ref, smem)
    plgpu.barrier_wait(bar)
    if not piece:
      plgpu.copy_smem_to_gmem(smem, o_ref)
      plgpu.wait_smem_to_gmem(0)
      return
    x = plgpu.load(smem.at[:, pl.ds(first, PIECE)], (), layout=layout, optimized=False)
    if to_float:
      x = lax.bitcast_convert_type(x, jnp.float8_e4m3fn)
    o_ref[...] = x.astype(jnp.float32)
  scratch = dict(smem=plgpu.SMEM((64, pitch), rows.dtype),
                 bar=plgpu.Barrier(num_arrivals=64 if by_rows else 1))
  out = (64, PIECE) if piece else (64, pitch)
  return kernel(body, out, jnp.float32 if piece else rows.dtype, scratch)(rows)


def row_bcast(v):
  def body(v_ref, o_ref):
    row = plgpu.load(v_ref, (), layout=plgpu.Layout.WGMMA.reduce(1), optimized=False)
    o_ref[...] = plgpu.layout_cast(lax.broadcast_in_dim(row, (64, PIECE), [0]), UPCAST)
  return kernel(body, (64, PIECE), jnp.float32)(v)


def store_piece(values):
  swizzled = (plgpu.TilingTransform((8, PIECE)), plgpu.SwizzleTransform(2 * PIECE))

  def body(v_ref, o_ref, smem):
    zero = plgpu.layout_cast(jnp.zeros((64, PIECE), jnp.bfloat16), UPCAST)
    for c in range(256 // PIECE):
      smem[:, pl.ds(PIECE * c, PIECE)] = zero
    x = plgpu.load(v_ref, (), layout=UPCAST, optimized=False)
    smem[:, pl.ds(96, PIECE)] = x.astype(jnp.bfloat16)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref)
    plgpu.wait_smem_to_gmem(0)
  scratch = dict(smem=plgpu.SMEM((64, 256), jnp.bfloat16, transforms=swizzled))
  return kernel(body, (64, 256), jnp.bfloat16, scratch)(values)


def idx_tma(indices, offset, scalar_reads):
  """A TMA of indices[offset:offset + 64] into slot 1 of a [2, 64] SMEM buffer, read back as
  64 scalars (scalar_reads) or copied out by a TMA."""
  def body(i_ref, off_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(i_ref.at[pl.ds(off_ref[0], 64)], smem.at[1], bar)
    plgpu.barrier_wait(bar)
    if scalar_reads:
      for j in range(64):
        o_ref[j] = smem[1, j]
    else:
      plgpu.copy_smem_to_gmem(smem.at[1], o_ref)
      plgpu.wait_smem_to_gmem(0)
  scratch = dict(smem=plgpu.SMEM((2, 64), jnp.int32), bar=plgpu.Barrier(num_arrivals=1))
  return kernel(body, (64,), jnp.int32, scratch)(indices, offset)


def cases():
  rng = np.random.default_rng(0)
  packed = rng.integers(0, 256, (64, 512)).astype(np.uint8)
  packed[packed & 127 == 127] = 0  # no NaN codes: exact comparison
  rope = rng.standard_normal((64, 64)).astype(jnp.bfloat16)
  v = rng.standard_normal(64).astype(np.float32)
  piece = rng.standard_normal((64, PIECE)).astype(np.float32)
  want_store = np.zeros((64, 256), np.float32)
  want_store[:, 96:96 + PIECE] = np.asarray(jnp.asarray(piece, jnp.bfloat16), np.float32)
  indices = rng.integers(0, 1 << 20, 300).astype(np.int32)
  offset = np.array([37], np.int32)
  fp8 = lambda b: np.asarray(jnp.asarray(b.view(jnp.float8_e4m3fn), jnp.float32))
  padded = rng.integers(0, 256, (64, PITCH)).astype(np.uint8)
  packed_pitch = np.concatenate([packed, packed[:, :PITCH - 512]], axis=1)
  wgmma = plgpu.Layout.WGMMA
  return {
      "copied_rows": (lambda: staged(packed, PITCH, by_rows=True)[:, :512], packed),
      "wgmma_padded": (lambda: staged(padded, PITCH, by_rows=False, first=96, layout=wgmma),
                       padded[:, 96:128]),
      "upcast_padded": (lambda: staged(padded, PITCH, by_rows=False, first=96),
                        padded[:, 96:128]),
      "upcast_unpadded": (lambda: staged(packed, 512, by_rows=False, first=96),
                          packed[:, 96:128]),
      "upcast_fp8_filled": (lambda: staged(packed_pitch, PITCH, by_rows=False, first=96,
                                           to_float=True), fp8(packed_pitch[:, 96:128])),
      "wgmma_fp8_filled": (lambda: staged(packed_pitch, PITCH, by_rows=False, first=96,
                                          layout=wgmma, to_float=True),
                           fp8(packed_pitch[:, 96:128])),
      "upcast_rows_int": (lambda: staged(packed, PITCH, by_rows=True, first=96),
                          packed[:, 96:128]),
      "idx_tma_only": (lambda: idx_tma(indices, offset, False), indices[37:101]),
      "fp8_piece": (lambda: staged(packed, PITCH, by_rows=True, first=96, to_float=True),
                    fp8(packed[:, 96:128])),
      "rope_piece": (lambda: staged(rope, 96, by_rows=True, first=PIECE),
                     np.asarray(rope[:, 32:64], np.float32)),
      "row_bcast": (lambda: row_bcast(v), np.broadcast_to(v[:, None], (64, PIECE))),
      "store_piece": (lambda: store_piece(piece), want_store),
      "idx_tma": (lambda: idx_tma(indices, offset, True), indices[37:101]),
  }


def probe(name, lower_only):
  run, want = cases()[name]
  if lower_only:
    jax.export.export(jax.jit(run), platforms=["cuda"], disabled_checks=[
        jax.export.DisabledSafetyCheck.custom_call("mosaic_gpu_v2")])()
    print(name, "lowers", flush=True)
    return
  got = np.asarray(jnp.asarray(run(), jnp.float32))
  want = np.asarray(want, np.float32)
  bad = np.argwhere(got != want)
  print(name, "exact" if not len(bad) else f"WRONG at {len(bad)} of {want.size}; first "
        f"{[(tuple(i), float(got[tuple(i)]), float(want[tuple(i)])) for i in bad[:4]]}",
        flush=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--lower-only", action="store_true")
  parser.add_argument("--only", default="", help="run this probe in this process")
  args = parser.parse_args()
  if args.only:
    probe(args.only, args.lower_only)
    return
  for name in cases():
    cmd = [sys.executable, __file__, "--only", name] + (["--lower-only"] if args.lower_only else [])
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    verdict = [l for l in done.stdout.splitlines() if l.startswith(name + " ")]
    if done.returncode or not verdict:
      errors = [l for l in done.stderr.splitlines() if "rror" in l]
      print(name, "FAILED:", (errors or ["?"])[0][:300], flush=True)
    else:
      print(verdict[-1], flush=True)


if __name__ == "__main__":
  main()
