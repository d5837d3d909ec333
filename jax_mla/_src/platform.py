"""What devices JAX sees and whether one is a gfx950; detection fails closed (unknown = no)."""

from __future__ import annotations

import jax

GFX950 = "gfx950"


def device_arch(device) -> str | None:
  """The gfx arch name of a ROCm device, or None when it cannot be told for certain."""
  if device.platform != "rocm":
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


def default_platform() -> str:
  return jax.default_backend()


def is_gfx950(device) -> bool:
  return device_arch(device) == GFX950
