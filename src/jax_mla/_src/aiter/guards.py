"""The plain-jit guard of the kernel primitives: the custom call is one kernel launch that XLA
cannot partition, so a plain `jax.jit` over sharded operands would gather every operand onto every
device and run the whole batch everywhere. The primitives refuse that and point at the
`jax_mla.sharding` recipes (docs/sharding.md)."""

from __future__ import annotations

import jax

RECIPE = ("wrap the call in jax.shard_map, e.g. with jax_mla.sharding.decode_rows_sharded / "
          "decode_persistent_rows_sharded (rows across devices) or decode_heads_sharded (heads "
          "across devices); see docs/sharding.md")


def check_not_partitioned(name: str, *arrays) -> None:
  """Raises when an operand is sharded over a mesh axis outside shard_map.

  Sees what JAX knows at trace time: the sharding in a value's type under Explicit mesh axes
  (`jax.typeof(x).sharding`), and the sharding of a concrete jax.Array in an eager call. Under
  Auto axes a traced value carries no sharding; docs/sharding.md says what XLA does then.
  """
  for x in arrays:
    spec = _sharded_spec(x)
    if spec is not None:
      raise ValueError(
          f"jax_mla {name}: an operand of shape {tuple(x.shape)} is sharded as {spec} outside "
          "shard_map. The kernel is one custom call that XLA cannot partition, so it would "
          f"gather every operand onto every device and run the whole batch everywhere. To run "
          f"per device, {RECIPE}.")


def _sharded_spec(x):
  """The PartitionSpec of x when it splits x over some mesh axis, else None."""
  if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
    sharding = x.sharding
    if not sharding.is_fully_replicated and len(sharding.device_set) > 1:
      return getattr(sharding, "spec", sharding)
    return None
  try:
    sharding = jax.typeof(x).sharding
  except (AttributeError, TypeError):
    return None
  spec = getattr(sharding, "spec", None)
  mesh = getattr(sharding, "mesh", None)
  if spec is None or mesh is None or getattr(mesh, "empty", True):
    return None
  if any(entry is not None for entry in spec):
    return spec
  return None


def check_lowering_not_replicated(ctx, name: str) -> None:
  """Raises when the kernel is lowered into a computation over several devices outside
  shard_map (what a plain jit over sharded inputs gives under Auto axes, where the trace-time
  check sees no sharding): XLA would gather every operand and run the whole batch everywhere.

  Reads the lowering context's axis context by duck typing (no private import): a jit over D
  devices lowers with a "ShardingContext" of num_devices = D; inside shard_map the context is
  manual ("SPMDAxisContext") and the call is per shard. Anything unrecognised passes.
  """
  axis_context = getattr(getattr(ctx, "module_context", None), "axis_context", None)
  if type(axis_context).__name__ != "ShardingContext":
    return
  num_devices = getattr(axis_context, "num_devices", 1)
  if isinstance(num_devices, int) and num_devices > 1:
    raise ValueError(
        f"jax_mla {name} is being compiled for {num_devices} devices outside shard_map. The "
        "kernel is one custom call that XLA cannot partition: it would gather every operand "
        f"onto every device and run the whole batch on each. To run per device, {RECIPE}.")
