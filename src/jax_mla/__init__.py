"""jax_mla: DeepSeek-V4 fp8 MLA decode for JAX.

Public API (everything else lives in private modules under jax_mla._src):

- `decode`: the split-plus-merge decode (AMD's "nm" kernel on gfx950, the host backend on CPU,
  the Pallas kernels on GPUs, the pure-JAX reference anywhere); `KVSource`: a second KV pool
  for `decode(..., extra=)`, e.g. the compressed cache's top-k beside the sliding window.
- `decode_persistent`, `make_workspace`, `reset_workspace`, `Workspace`: the one-launch path
  (AMD's "nm_ps" kernel) with its workspace passed as an operand.
- `pack_rows` / `unpack_rows`: the packed fp8 row format of Q and the KV cache;
  `to_flashmla` / `from_flashmla`: FlashMLA's MODEL1_FP8Sparse byte order.
  `to_tpu_inference` / `from_tpu_inference`: tpu-inference's DeepSeek-V4 CSA cache arrays.
- `update_cache`, `ragged_from_topk`, `pool_rows`: per-step cache and index helpers.
- `jax_mla.plan.num_kv_splits`: the split planner.
- `jax_mla.sharding`: shard_map recipes for rows across devices and heads across devices.
- `set_code_object_dir`: where to find AMD's gfx950 code objects (see docs/code_objects.md).
"""

from jax_mla import plan, sharding
from jax_mla._src.kv_cache import pool_rows, ragged_from_topk, update_cache
from jax_mla._src.aiter.code_objects.find import set_code_object_dir
from jax_mla._src.api import decode, decode_persistent
from jax_mla._src.sources import KVSource
from jax_mla._src.layout import (from_flashmla, from_tpu_inference, pack_rows, to_flashmla,
                                 to_tpu_inference, unpack_rows)
from jax_mla._src.workspace import Workspace, make_workspace, reset_workspace

__version__ = "0.1.0"

__all__ = [
    "KVSource",
    "Workspace",
    "decode",
    "decode_persistent",
    "from_flashmla",
    "from_tpu_inference",
    "make_workspace",
    "pack_rows",
    "plan",
    "pool_rows",
    "ragged_from_topk",
    "reset_workspace",
    "set_code_object_dir",
    "sharding",
    "to_flashmla",
    "to_tpu_inference",
    "unpack_rows",
    "update_cache",
]
