"""Building MaxText 0.2.5 DeepSeek-V4 attention layers: a config from MaxText's own
`deepseek4-tiny` model file with the V4 attention shape, and `CompressedAttention` layers.

Only `maxtext.configs.pyconfig` and `maxtext.layers.attention_compressed` are imported (not
`maxtext.models.deepseek4`, whose MoE pulls in transformers): the attention layer is the same
class the model instantiates, with the same arguments (models/deepseek4.py).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from maxtext.common.common_types import AttentionType
from maxtext.configs import pyconfig
from maxtext.layers.attention_compressed import CompressedAttention
from maxtext.utils.globals import MAXTEXT_CONFIGS_DIR

# DeepSeek-V4-Flash's attention (MaxText's configs/models/deepseek4-284b.yml).
REAL_SHAPE = dict(emb_dim=4096, num_heads=64, q_lora_rank=1024, o_groups=8, o_lora_rank=1024,
                  window=128, indexer_heads=64, indexer_head_dim=128, indexer_topk=512)
# Small but with V4's head layout (head_dim 512, RoPE 64, 64 heads, one latent KV head).
TINY_SHAPE = dict(emb_dim=64, num_heads=64, q_lora_rank=16, o_groups=4, o_lora_rank=16,
                  window=8, indexer_heads=4, indexer_head_dim=64, indexer_topk=3)


def config(*, max_prefill: int, max_target: int, emb_dim: int, num_heads: int, q_lora_rank: int,
           o_groups: int, o_lora_rank: int, window: int, indexer_heads: int,
           indexer_head_dim: int, indexer_topk: int, dtype: str = "float32",
           matmul_precision: str = "default", batch: int = 1):
  """A MaxText config: deepseek4-tiny with the given attention shape, head_dim 512, RoPE 64.

  The indexer's head dim must be >= 64: MaxText applies the layer's 64-dim RoPE to it."""
  return pyconfig.initialize(
      ["", os.path.join(MAXTEXT_CONFIGS_DIR, "base.yml")], model_name="deepseek4-tiny",
      override_model_config=True, run_name="jax_mla", enable_checkpointing=False,
      skip_jax_distributed_system=True, per_device_batch_size=batch,
      max_prefill_predict_length=max_prefill, max_target_length=max_target,
      attention="dot_product", dtype=dtype, matmul_precision=matmul_precision,
      head_dim=512, qk_rope_head_dim=64, base_emb_dim=emb_dim, base_num_query_heads=num_heads,
      base_num_kv_heads=1, q_lora_rank=q_lora_rank, o_groups=o_groups, o_lora_rank=o_lora_rank,
      sliding_window_size=window, indexer_n_heads=indexer_heads,
      indexer_head_dim=indexer_head_dim, indexer_topk=indexer_topk)


def mesh(cfg):
  """A one-device mesh with the config's axis names."""
  devices = np.array(jax.devices()[:1]).reshape([1] * len(cfg.mesh_axes))
  return jax.sharding.Mesh(devices, cfg.mesh_axes)


def layer(cfg, the_mesh, *, compress_ratio: int, model_mode: str, seed: int = 0,
          batch: int | None = None, window: int | None = None, max_target: int | None = None):
  """A `CompressedAttention` as models/deepseek4.py builds it (0: window only, 4: CSA, >4: HCA),
  with the config's sliding window and max_target_length unless `window` / `max_target` are
  given. Build it under `jax.set_mesh(the_mesh)`."""
  batch = batch or cfg.per_device_batch_size
  dtype = jnp.dtype(cfg.dtype)
  return CompressedAttention(
      config=cfg, compress_ratio=compress_ratio, num_query_heads=cfg.num_query_heads,
      num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
      max_target_length=max_target or cfg.max_target_length,
      max_prefill_predict_length=cfg.max_prefill_predict_length,
      attention_kernel=cfg.attention, attention_type=AttentionType(cfg.attention_type),
      inputs_q_shape=(batch, 1, cfg.emb_dim), inputs_kv_shape=(batch, 1, cfg.emb_dim),
      mesh=the_mesh, dtype=dtype, weight_dtype=jnp.dtype(cfg.weight_dtype),
      sliding_window_size=window or cfg.sliding_window_size, q_lora_rank=cfg.q_lora_rank,
      model_mode=model_mode, rngs=nnx.Rngs(seed))


def randomize(the_layer, seed: int = 0) -> None:
  """Gives the parameters MaxText initialises to constants (sinks 0, position biases 0, norm
  scales 1) random values, so that every one of them shows in the outputs."""
  params = nnx.state(the_layer, nnx.Param)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  key = jax.random.key(seed)
  new = []
  for i, (path, value) in enumerate(leaves):
    name = jax.tree_util.keystr(path)
    k = jax.random.fold_in(key, i)
    if "sinks" in name:
      value = jax.random.normal(k, value.shape, value.dtype) * 2.0
    elif "position_bias" in name:
      value = jax.random.normal(k, value.shape, value.dtype) * 0.5
    elif "norm" in name and "scale" in name:
      value = 1.0 + 0.2 * jax.random.normal(k, value.shape, value.dtype)
    new.append(value)
  nnx.update(the_layer, jax.tree_util.tree_unflatten(treedef, new))


def copy_params(src, dst) -> None:
  """dst's parameters := src's (layers built with different model modes)."""
  nnx.update(dst, nnx.state(src, nnx.Param))
