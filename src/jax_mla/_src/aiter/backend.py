"""backend="gfx950" and backend="host": AMD's aiter kernels, launched on an MI355X, or run by the
host executor on a CPU from the same kernel arguments. The registry's entry points for both.
"""

from __future__ import annotations

import jax

from jax_mla._src import platform
from jax_mla._src.aiter import split
from jax_mla._src.aiter.code_objects import manifest

SPLIT_KERNEL = "mla_v4_nm"  # decode: split + merge
PERSISTENT_KERNEL = "mla_v4_nm_ps"  # decode_persistent: one launch


def split_layouts() -> tuple[tuple[int, int], ...]:
  """(heads, tokens_per_seq) the split path serves: the nm kernel's (the manifest's `serves`)
  and the padded head counts."""
  served = manifest.kernel(SPLIT_KERNEL).serves
  padded = tuple((h, m) for h, target in split.PADDED_HEADS.items()
                 for g, m in served if g == target)
  return tuple(sorted(served + padded))


def persistent_layouts() -> tuple[tuple[int, int], ...]:
  """(heads, tokens_per_seq) the nm_ps kernel serves (the manifest's `serves`)."""
  return manifest.kernel(PERSISTENT_KERNEL).serves


def host_available() -> tuple[bool, str]:
  from jax_mla._src import ext  # pylint: disable=import-outside-toplevel
  try:
    ext.extension()
  except ImportError as e:
    return False, str(e)
  return True, "the C++ extension is built"


def gfx950_available() -> tuple[bool, str]:
  """Whether the default device is a gfx950 whose code objects are found and verify."""
  device = jax.devices()[0]
  if platform.gpu_vendor(device) != "rocm":
    return False, f"the default device is {device.platform}, not a ROCm GPU"
  if not platform.is_gfx950(device):
    return False, (f"the ROCm device {getattr(device, 'device_kind', device)!r} is not "
                   "recognised as gfx950 (detection fails closed)")
  try:
    from jax_mla._src.aiter.code_objects import find  # pylint: disable=import-outside-toplevel
    find.find_code_object(SPLIT_KERNEL)
  except Exception as e:  # pylint: disable=broad-except
    return False, f"no usable code object: {e}"
  return True, "gfx950 device with verified code objects"


def decode(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, *, tokens_per_seq: int,
           num_kv_splits: int | None, return_lse: bool, backend: str):
  """`jax_mla.decode` on the nm kernel (backend "gfx950") or its host executor ("host")."""
  if backend == "gfx950":
    from jax_mla._src.aiter.code_objects import register  # pylint: disable=import-outside-toplevel
    register.prepare(SPLIT_KERNEL)
  return split.split_decode(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink,
                            tokens_per_seq=tokens_per_seq, num_kv_splits=num_kv_splits,
                            backend=backend, return_lse=return_lse)


def decode_persistent(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, workspace, *,
                      return_lse: bool, backend: str):
  """`jax_mla.decode_persistent` on the nm_ps kernel (backend "gfx950") or its host executor."""
  from jax_mla._src.aiter import persistent  # pylint: disable=import-outside-toplevel
  if backend == "gfx950":
    from jax_mla._src.aiter.code_objects import register  # pylint: disable=import-outside-toplevel
    register.prepare(PERSISTENT_KERNEL)
  return persistent.decode_persistent(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink,
                                      workspace, return_lse=return_lse, backend=backend)
