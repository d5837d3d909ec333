"""The kernel backends are forward only: differentiating through one raises an error that says so.

Without this, `jax.grad` through the gfx950 and host backends raised JAX's generic "Differentiation
rule for 'jax_mla_split_decode' not implemented", and through the Pallas backend a ValueError
about linearization that names nothing of jax_mla. A `jax.custom_jvp` around the backend's call
adds nothing to the forward computation (it lowers to the call itself) and its rule runs only
when a tangent reaches the call: decoding inside a differentiated program, with no derivative
flowing through the attention, still runs.
"""

from __future__ import annotations

import jax


def call(backend: str, fn, *args):
  """fn(*args), args and results arrays or pytrees of them (None included)."""

  @jax.custom_jvp
  def run(*args):
    return fn(*args)

  @run.defjvp
  def _refuse(primals, tangents):
    del primals, tangents
    raise NotImplementedError(
        f"jax_mla: backend={backend!r} is forward only (its kernels have no derivative rule); "
        "backend='reference' is plain JAX and differentiable")

  return run(*args)
