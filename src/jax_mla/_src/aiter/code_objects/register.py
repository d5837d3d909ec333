"""Handing verified code objects to the C++ launcher before a gfx950 launch.

Only needed when the computation will run on a ROCm device: lowering for `rocm` on another
machine (jax.export) needs no code object. Each kernel's image is verified (code_objects) and
registered once per process; the launcher loads it into a module once per device.
"""

from __future__ import annotations

import threading

from jax_mla._src import ext, platform
from jax_mla._src.aiter.code_objects import find as code_objects

_lock = threading.Lock()
_registered: set[str] = set()


def prepare(kernel_id: str) -> None:
  """Finds, verifies and registers `kernel_id`'s code object if a ROCm device is present.

  Raises code_objects.CodeObjectError (naming every place searched, or the failed check) when
  no usable code object exists.
  """
  if not platform.default_device_is_rocm():
    return
  with _lock:
    if kernel_id in _registered:
      return
    image = code_objects.load_verified_image(kernel_id)
    ext.extension().register_code_object(kernel_id, image)
    _registered.add(kernel_id)
