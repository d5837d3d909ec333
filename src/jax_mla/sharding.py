"""Decode on many devices (docs/sharding.md).

- `decode_rows_sharded`, `decode_persistent_rows_sharded`, `make_sharded_workspace`: rows, KV
  pool and indices split across a mesh axis (data-parallel attention), one workspace per device.
- `decode_heads_sharded`: heads split across a mesh axis (tensor parallelism), split path.
- `shard_map`: jax.shard_map or its older home, whichever this jax has.
"""

from jax_mla._src.sharding import (decode_heads_sharded, decode_persistent_rows_sharded,
                                   decode_rows_sharded, make_sharded_workspace, shard_map)

__all__ = [
    "decode_heads_sharded",
    "decode_persistent_rows_sharded",
    "decode_rows_sharded",
    "make_sharded_workspace",
    "shard_map",
]
