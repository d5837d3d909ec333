"""Test harness for the Mosaic producer's K-tile fills: one CTA, one warpgroup, the tile copied
out to global memory so that a test can compare it with numpy."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def k_tile_kernel(fill, *operands):
  """The K tile [2, 64, 256] bf16 that `fill(*operand_refs, smem)` writes into shared memory."""
  # pylint: disable=import-outside-toplevel
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from jax_mla._src.pallas.mosaic import gather as mg

  def body(*refs, smem):
    *in_refs, out_ref = refs
    fill(*in_refs, smem)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, out_ref)
    plgpu.wait_smem_to_gmem(0)

  tile = jax.ShapeDtypeStruct((2, mg.BLOCK_ROWS, mg.HALF), jnp.bfloat16)
  scratch = dict(smem=plgpu.SMEM(tile.shape, tile.dtype, transforms=mg.k_tile_transforms()))
  return plgpu.kernel(body, out_type=tile, scratch_types=scratch)(*operands)
