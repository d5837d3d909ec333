"""Static choices of the Pallas backend: row block, kernel config, KV split count.

Everything here is a function of static shapes only, so one compiled executable serves every
set of KV lengths of a shape.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_mla._src import layout

# Multiprocessors of an H100/H200; used when the device does not say.
DEFAULT_NUM_SMS = 132
# A split should walk at least this many KV entries, or the merge costs more than it saves.
MIN_ENTRIES_PER_SPLIT = 256
MAX_SPLITS = 64


def row_block(rows: int) -> int:
  """Query rows per program: 64 (one MMA M tile per warpgroup) or the next power of 2 >= 16."""
  block = 16
  while block < min(rows, 64):
    block *= 2
  return block


def default_config(rows: int):
  from jax_mla._src.pallas_decode import KernelConfig  # pylint: disable=import-outside-toplevel
  del rows
  return KernelConfig()


def num_sms() -> int:
  try:
    return int(getattr(jax.devices()[0], "core_count", 0)) or DEFAULT_NUM_SMS
  except Exception:  # pylint: disable=broad-except
    return DEFAULT_NUM_SMS


def num_kv_splits(num_seqs: int, row_blocks: int, num_indices: int, block_kv: int, *,
                  min_entries: int = MIN_ENTRIES_PER_SPLIT) -> int:
  """Enough programs to fill the GPU, but no split shorter than `min_entries` entries of the
  average row (num_indices / num_seqs is the static length hint)."""
  programs = num_seqs * row_blocks
  fill = -(-num_sms() // programs)
  avg_len = num_indices // max(num_seqs, 1)
  by_length = max(1, avg_len // max(min_entries, block_kv))
  return int(max(1, min(fill, by_length, MAX_SPLITS)))


def sink_rows(sink, tokens_per_seq: int, padded_rows: int):
  """f32 [padded_rows]: each query row's sink (the tokens of a sequence repeat the heads'), and
  -inf (no sink) for the padding rows."""
  rows = jnp.tile(sink.astype(jnp.float32), tokens_per_seq)
  return jnp.pad(rows, (0, padded_rows - rows.shape[0]), constant_values=-jnp.inf)


def result_types(num_seqs: int, num_splits: int, padded_rows: int):
  """The kernels' outputs: with one split the final bf16 out [B, R, 512] and lse [B, R]; with
  more the f32 partials [B, S, R, 512] and their lse [B, S, R], for `pallas_merge`."""
  if num_splits == 1:
    return (jax.ShapeDtypeStruct((num_seqs, padded_rows, layout.HEAD_DIM), jnp.bfloat16),
            jax.ShapeDtypeStruct((num_seqs, padded_rows), jnp.float32))
  return (
      jax.ShapeDtypeStruct((num_seqs, num_splits, padded_rows, layout.HEAD_DIM), jnp.float32),
      jax.ShapeDtypeStruct((num_seqs, num_splits, padded_rows), jnp.float32))
