"""Where the supported jax releases (0.10.2 through 0.12.x) differ, in one place.

Everything else in jax_mla is written once against the API these releases share.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect


@functools.cache
def _mgpu_load_takes_index() -> bool:
  # jax 0.10 requires `plgpu.load(ref, idx, ...)`; 0.11 deprecates the index and 0.12 removes it,
  # so the index always goes into `ref.at[...]` and is passed apart only where it is required.
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  idx = inspect.signature(plgpu.load).parameters.get("idx")
  return idx is not None and idx.default is inspect.Parameter.empty


def mgpu_load(ref, *, layout=None, optimized: bool = True):
  """Mosaic GPU's `plgpu.load` of a whole (already indexed) ref, on every supported jax."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  if _mgpu_load_takes_index():
    return plgpu.load(ref, (), layout=layout, optimized=optimized)
  return plgpu.load(ref, layout=layout, optimized=optimized)


@functools.cache
def _ref_type_records_writes() -> bool:
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  return "write" in {field.name for field in dataclasses.fields(plgpu.RefType)}


def read_only_ref_type(transforms=()):
  """`plgpu.RefType` of a ref that an `inline_mgpu` function only reads (a kernel input: the
  pool, the indices, Q, the sinks). jax 0.12.1 records a write effect for every RefType unless
  it says `write=False`, and a kernel that writes an input passed as an array fails to trace;
  earlier releases have no such field and record no effects."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  if _ref_type_records_writes():
    return plgpu.RefType(transforms, write=False)
  return plgpu.RefType(transforms)
