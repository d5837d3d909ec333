"""What devices JAX sees and whether one is a gfx950; detection fails closed (unknown = no)."""

from __future__ import annotations

import jax

GFX950 = "gfx950"


def gpu_vendor(device) -> str | None:
  """"rocm", "cuda" or None. JAX reports GPU devices' platform as "gpu" in some versions and as
  "rocm"/"cuda" in others; the client's platform version names the runtime either way."""
  platform = str(getattr(device, "platform", ""))
  if platform in ("rocm", "cuda"):
    return platform
  if platform != "gpu":
    return None
  version = str(getattr(getattr(device, "client", None), "platform_version", "")).lower()
  for vendor in ("rocm", "cuda"):
    if vendor in version:
      return vendor
  return None


def device_arch(device) -> str | None:
  """The gfx arch name of a ROCm device, or None when it cannot be told for certain."""
  if gpu_vendor(device) != "rocm":
    return None
  for attr in ("compute_capability", "device_kind"):
    value = str(getattr(device, attr, "") or "").lower()
    for token in value.replace(":", " ").split():
      if token.startswith("gfx"):
        return token
  kind = str(getattr(device, "device_kind", "") or "")
  if "MI355" in kind or "MI350" in kind:  # device_kind names the product, not the arch
    return GFX950
  return None


def default_device_is_rocm() -> bool:
  return gpu_vendor(jax.devices()[0]) == "rocm"


def is_gfx950(device) -> bool:
  return device_arch(device) == GFX950
