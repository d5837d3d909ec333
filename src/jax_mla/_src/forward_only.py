"""The kernel backends are forward only: differentiating through one raises an error that says so.

JAX's own errors there name an internal primitive (gfx950, host: "Differentiation rule for
'jax_mla_split_decode' not implemented") or a failed linearization (Pallas), nothing a user
passed. A `jax.custom_jvp` around the backend's call adds nothing to the forward computation
(it lowers to the call itself), and its rule runs only when a tangent reaches the call: a decode
inside a differentiated program that no derivative flows through still runs.
"""

from __future__ import annotations

import jax


def call(entry, fn, *args):
  """fn(*args), the call of backend `entry` (a backends.Backend): as it is where the backend is
  differentiable, else refusing a tangent. args and results: arrays or pytrees of them."""
  if entry.differentiable:
    return fn(*args)
  backend = entry.name

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
