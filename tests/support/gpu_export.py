"""Exporting for a GPU platform from any machine, the one way every lowering test does it.

jax 0.12 asks for an abstract GPU device when a Pallas kernel is lowered for a GPU on a machine
without one; 0.10 and 0.11 accept it too, so every supported jax runs the same path.
"""

from __future__ import annotations

import jax

# The GPUs the lowerings target: the Hopper the Mosaic kernel is written for, and AMD's gfx950.
ABSTRACT_DEVICE_KINDS = {"cuda": "NVIDIA H200", "rocm": "gfx950"}


def export_for(fn, platform: str, *args, custom_calls=()):
  """`jax.export` of `jax.jit(fn)` for "cuda" or "rocm" under an abstract GPU device of that
  platform. `custom_calls` names targets without a compatibility guarantee (Triton, Mosaic GPU,
  jax_mla's own), whose export check is disabled."""
  device = jax.sharding.AbstractDevice(device_kind=ABSTRACT_DEVICE_KINDS[platform],
                                       num_cores=None, platform="gpu")
  mesh = jax.sharding.AbstractMesh((1,), ("_",), abstract_device=device)
  checks = [jax.export.DisabledSafetyCheck.custom_call(name) for name in custom_calls]
  with jax.sharding.use_abstract_mesh(mesh):
    return jax.export.export(jax.jit(fn), platforms=[platform], disabled_checks=checks)(*args)
