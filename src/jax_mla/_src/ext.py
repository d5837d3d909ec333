"""Loading the C++ extension and registering its FFI handlers with XLA, once."""

from __future__ import annotations

import functools
import threading

import jax

_lock = threading.Lock()
_registered = False


@functools.cache
def extension():
  """The compiled `jax_mla._ext` module; raises ImportError saying how to build it."""
  try:
    from jax_mla import _ext  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError(
        "jax_mla's C++ extension (jax_mla._ext) is not built. Install the package with "
        "`pip install .`, or for a source checkout run `tools/dev_build.sh`. The 'reference' "
        f"backend works without it. ({e})") from e
  return _ext


def ensure_registered() -> None:
  """Registers every FFI target of the extension for its platform. Idempotent, thread-safe."""
  global _registered
  if _registered:
    return
  with _lock:
    if _registered:
      return
    ext = extension()
    # The CPU client must exist before registration: it flushes queued handlers before queued
    # types, so registering both ahead of it fails (see ../shared/research/jax-ffi.md, 1.8).
    jax.devices()
    for platform, targets in ext.registrations().items():
      for name, capsule in targets.items():
        jax.ffi.register_ffi_target(name, capsule, platform=platform)
    _registered = True
