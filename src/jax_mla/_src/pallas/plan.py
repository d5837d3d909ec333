"""Static choices of the Pallas kernels: row block, KV split count, result types.

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


def num_sms() -> int:
  try:
    return int(getattr(jax.devices()[0], "core_count", 0)) or DEFAULT_NUM_SMS
  except Exception:  # pylint: disable=broad-except
    return DEFAULT_NUM_SMS


# num_kv_splits's rules; "waves" is for kernels that run one program per multiprocessor.
SPLIT_RULES = ("fill", "waves")


def num_kv_splits(num_seqs: int, row_blocks: int, num_indices: int, block_kv: int, *,
                  min_entries: int = MIN_ENTRIES_PER_SPLIT, rule: str = "fill") -> int:
  """Enough programs to fill the GPU, but no split shorter than `min_entries` entries of the
  average row (num_indices / num_seqs is the static length hint).

  rule "fill": ceil(SMs / programs) splits. rule "waves": of 1 .. that many, the fewest splits
  with the shortest critical path, ceil(programs * s / SMs) waves of ceil(blocks / s) KV blocks
  each (64 programs on 132 SMs: 2 splits, one wave, where "fill" makes 3, two waves)."""
  if rule not in SPLIT_RULES:
    raise ValueError(f"split rule must be one of {SPLIT_RULES}, got {rule!r}")
  programs = num_seqs * row_blocks
  sms = num_sms()
  avg_len = num_indices // max(num_seqs, 1)
  by_length = max(1, avg_len // max(min_entries, block_kv))
  fill = int(max(1, min(-(-sms // programs), by_length, MAX_SPLITS)))
  if rule == "fill":
    return fill
  blocks = max(1, -(-avg_len // block_kv))
  path = lambda s: -(-programs * s // sms) * -(-blocks // s)
  return min(range(1, fill + 1), key=lambda s: (path(s), s))


def sink_rows(sink, tokens_per_seq: int, padded_rows: int):
  """f32 [padded_rows]: each query row's sink (the tokens of a sequence repeat the heads'), and
  -inf (no sink) for the padding rows."""
  rows = jnp.tile(sink.astype(jnp.float32), tokens_per_seq)
  return jnp.pad(rows, (0, padded_rows - rows.shape[0]), constant_values=-jnp.inf)


def result_types(num_seqs: int, num_splits: int, padded_rows: int, partials=jnp.float32,
                 result_rows: int | None = None):
  """The kernels' outputs: with one split the final bf16 out [B, rows, 512] and lse [B, R];
  with more the partials [B, S, rows, 512] (of dtype `partials`) and their f32 lse [B, S, R],
  for `pallas.merge` (R: padded_rows; rows: result_rows, the real rows a kernel writes, else
  R)."""
  rows = result_rows or padded_rows
  if num_splits == 1:
    return (jax.ShapeDtypeStruct((num_seqs, rows, layout.HEAD_DIM), jnp.bfloat16),
            jax.ShapeDtypeStruct((num_seqs, padded_rows), jnp.float32))
  return (jax.ShapeDtypeStruct((num_seqs, num_splits, rows, layout.HEAD_DIM), partials),
          jax.ShapeDtypeStruct((num_seqs, num_splits, padded_rows), jnp.float32))


def float_kv_option(kv_rope, extra) -> dict:
  """The kernels' `float_kv` keyword: per source (A, B), whether its pool holds float rows (its
  RoPE ref absent); empty when neither does, so packed pools lower as without the option."""
  float_kv = (kv_rope is None, extra is not None and extra[1] is None)
  return {"float_kv": float_kv} if any(float_kv) else {}


def pool_inputs(kv, kv_rope):
  """A pool's kernel operands: packed rows and their RoPE, or float rows alone."""
  return (kv,) if kv_rope is None else (kv, kv_rope)


def pool_refs(refs, float_rows):
  """In a kernel, ((a pool's ref, its RoPE ref or None for float rows), the refs after them):
  pool_inputs's operands."""
  if float_rows:
    return (refs[0], None), refs[1:]
  return (refs[0], refs[1]), refs[2:]
