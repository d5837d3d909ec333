"""`check_indices=True`: device-side checks of kv_indptr / kv_indices before a kernel launch.

The gfx950 kernels read whatever row an index names, so a bad index is an out-of-bounds read.
These checks run on the device, as ordinary JAX ops ahead of the launch, and report through
`jax.experimental.checkify`:

- called eagerly, a violation raises `checkify.JaxRuntimeError` (a ValueError) before the kernel
  is launched;
- under `jax.jit`, wrap the function with `checkify.checkify(f, errors=checkify.user_checks)`
  and call `err.throw()` (or read `err.get()`); jitting without checkify fails at trace time
  with JAX's "not functionalized" error, so a check is never silently dropped.

Under checkify the kernel still runs after a violation is recorded, so the launch gets a
neutralised kv_indptr (every sequence empty): it reads no KV row at all, never a bad one.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import checkify


def checked_kv_indptr(kv_indptr, kv_indices, num_kv_rows: int, *, zero_start: bool):
  """Checks the ragged index contract on the device; returns the kv_indptr to launch with.

  Contract: kv_indptr is non-decreasing, starts at 0 (`zero_start`; else at >= 0, the persistent
  path allows an offset), ends at <= len(kv_indices), and every used entry
  `kv_indices[kv_indptr[0]:kv_indptr[-1]]` is in [0, num_kv_rows).
  """
  kv_indptr = jnp.asarray(kv_indptr)
  kv_indices = jnp.asarray(kv_indices)
  num_indices = kv_indices.shape[0]
  start, end = kv_indptr[0], kv_indptr[-1]

  start_ok = start == 0 if zero_start else start >= 0
  checkify.check(start_ok, "jax_mla check_indices: kv_indptr[0] = {} "
                 + ("must be 0" if zero_start else "must be >= 0"), start)
  monotone_ok = jnp.bool_(True)
  if kv_indptr.shape[0] > 1:
    decreasing = jnp.diff(kv_indptr) < 0
    drop = jnp.argmax(decreasing) + 1  # the first entry below its predecessor
    monotone_ok = ~jnp.any(decreasing)
    checkify.check(monotone_ok, "jax_mla check_indices: kv_indptr[{}] = {} < kv_indptr[{}] = {} "
                   "(must be non-decreasing)", drop, kv_indptr[drop], drop - 1,
                   kv_indptr[drop - 1])
  end_ok = end <= num_indices
  checkify.check(end_ok, f"jax_mla check_indices: kv_indptr[-1] = {{}} exceeds len(kv_indices) = "
                 f"{num_indices}", end)

  rows_ok = jnp.bool_(True)
  if num_indices:
    position = jnp.arange(num_indices, dtype=kv_indptr.dtype)
    used = (position >= start) & (position < end)
    bad = used & ((kv_indices < 0) | (kv_indices >= num_kv_rows))
    first = jnp.argmax(bad)
    rows_ok = ~jnp.any(bad)
    checkify.check(rows_ok, f"jax_mla check_indices: kv_indices[{{}}] = {{}} is outside "
                   f"[0, {num_kv_rows}) (the KV pool has {num_kv_rows} rows)", first,
                   kv_indices[first])

  all_ok = start_ok & monotone_ok & end_ok & rows_ok
  return jnp.where(all_ok, kv_indptr, jnp.zeros_like(kv_indptr))
