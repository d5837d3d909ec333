"""Choosing a backend: what "auto" picks, and why; explicit choices that cannot run raise."""

from __future__ import annotations

import warnings

import jax

from jax_mla._src import platform

BACKENDS = ("auto", "gfx950", "host", "pallas", "reference")


def check_backend_name(backend) -> None:
  if backend not in BACKENDS:
    raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")


def host_available() -> tuple[bool, str]:
  try:
    from jax_mla._src import ext  # pylint: disable=import-outside-toplevel
    ext.extension()
  except ImportError as e:
    return False, str(e)
  return True, "the C++ extension is built"


def gfx950_available() -> tuple[bool, str]:
  """Whether the default device is a gfx950 whose code objects are found and verify."""
  devices = jax.devices()
  device = devices[0]
  if platform.gpu_vendor(device) != "rocm":
    return False, f"the default device is {device.platform}, not a ROCm GPU"
  if not platform.is_gfx950(device):
    return False, (f"the ROCm device {getattr(device, 'device_kind', device)!r} is not "
                   "recognised as gfx950 (detection fails closed)")
  try:
    from jax_mla._src import code_objects  # pylint: disable=import-outside-toplevel
    for kernel_id in ("mla_v4_nm",):
      code_objects.find_code_object(kernel_id)
  except Exception as e:  # pylint: disable=broad-except
    return False, f"no usable code object: {e}"
  return True, "gfx950 device with verified code objects"


def explain_auto() -> tuple[str, str]:
  """(backend, reason) that backend="auto" resolves to for the default device."""
  ok, why = gfx950_available()
  if ok:
    return "gfx950", why
  from jax_mla._src import pallas_backend  # pylint: disable=import-outside-toplevel
  kernel, kernel_why = pallas_backend.kernel_for(jax.devices()[0])
  if kernel is not None:
    return "pallas", f"{kernel_why} ({why})"
  default = jax.default_backend()
  if default == "cpu":
    ok, host_why = host_available()
    if ok:
      return "host", "the default device is a CPU and " + host_why
    return "reference", f"the default device is a CPU but the host backend is missing: {host_why}"
  return "reference", f"default platform {default!r}: {why}"


class MissingExtensionWarning(RuntimeWarning):
  """backend="auto" fell back to the reference on a CPU because the C++ extension is missing."""


def resolve(backend: str) -> str:
  check_backend_name(backend)
  if backend == "auto":
    chosen, why = explain_auto()
    if chosen == "reference" and jax.default_backend() == "cpu":
      # Loud: a source tree put on sys.path by accident has no extension, and the reference
      # is several times slower than the host backend.
      warnings.warn(f"jax_mla: backend='auto' runs the slower pure-JAX reference: {why}",
                    MissingExtensionWarning, stacklevel=3)
    return chosen
  if backend == "host":
    ok, why = host_available()
    if not ok:
      raise RuntimeError(f"backend='host' cannot run: {why}")
  if backend == "pallas":
    from jax_mla._src import pallas_backend  # pylint: disable=import-outside-toplevel
    pallas_backend.default_kernel()  # raises where no Pallas kernel serves the device
  return backend
