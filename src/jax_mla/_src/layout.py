"""The packed fp8 row format of DeepSeek-V4 MLA decode (KERNELS.md section 2), in JAX.

A Q or KV row is 512 values: dims 0..447 ("NoPE") are stored as 448 fp8 e4m3fn bytes with one
power-of-two e8m0 scale per 64-value tile, dims 448..511 ("RoPE") as 64 bf16 values in a separate
buffer. The 512-byte packed row:

  bytes 0..447    fp8 e4m3fn values
  bytes 448..461  7 e8m0 scales, each stored twice: s0 s0 s1 s1 ... s6 s6
  bytes 462..511  padding: undefined content, never read

Everything here is jittable and shape-polymorphic over leading dims.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

HEAD_DIM = 512
NOPE_DIM = 448
ROPE_DIM = 64
TILE = 64
NUM_TILES = NOPE_DIM // TILE  # 7
ROW_BYTES = 512
SCALE_OFFSET = 448
SCALE_BYTES = 2 * NUM_TILES  # 14
PAD_OFFSET = SCALE_OFFSET + SCALE_BYTES  # 462
FP8_MAX = 448.0
# FlashMLA MODEL1 convention: scale = 2^ceil(log2(max(amax / 448, 1e-4))).
MIN_SCALE_RATIO = np.float32(1e-4)
E8M0_BIAS = 127
E8M0_NAN = 0xFF

# FlashMLA's MODEL1_FP8Sparse cache: per block, block_size x (448 fp8 + 64 bf16 RoPE) bytes, then
# block_size x (7 e8m0 + 1 pad) bytes.
FLASHMLA_TOKEN_DATA_BYTES = NOPE_DIM + 2 * ROPE_DIM  # 576
FLASHMLA_TOKEN_SCALE_BYTES = NUM_TILES + 1  # 8
FLASHMLA_BYTES_PER_TOKEN = FLASHMLA_TOKEN_DATA_BYTES + FLASHMLA_TOKEN_SCALE_BYTES  # 584


def _check_last_dim(name: str, x, size: int, dtypes: tuple) -> None:
  if x.ndim < 1 or x.shape[-1] != size:
    raise ValueError(f"{name} must have a last dimension of {size}; got shape {tuple(x.shape)}")
  if x.dtype not in dtypes:
    names = ", ".join(str(jnp.dtype(d)) for d in dtypes)
    raise TypeError(f"{name} must have dtype {names}; got {x.dtype}")


def _ceil_log2(x: jax.Array) -> jax.Array:
  """Exact ceil(log2(x)) for positive finite f32 x (frexp is exact; log2 may round)."""
  mantissa, exponent = jnp.frexp(x)
  return jnp.where(mantissa == 0.5, exponent - 1, exponent)


def tile_scale_exponents(nope: jax.Array) -> jax.Array:
  """Per-tile scale exponents e (scale = 2^e) of f32 [..., 448] values, int32 [..., 7].

  Tiles with a non-finite value get exponent 128, which encodes as e8m0 0xFF (NaN): a row built
  from non-finite input dequantizes to NaN instead of to plausible numbers.
  """
  tiles = nope.reshape(*nope.shape[:-1], NUM_TILES, TILE)
  amax = jnp.max(jnp.abs(tiles), axis=-1)
  ratio = jnp.maximum(amax / jnp.float32(FP8_MAX), MIN_SCALE_RATIO)
  exponent = _ceil_log2(ratio)
  return jnp.where(jnp.isfinite(amax), exponent, E8M0_NAN - E8M0_BIAS).astype(jnp.int32)


def pack_rows(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Quantizes rows of 512 values into the packed fp8 format.

  Args:
    x: bf16 or f32 `[..., 512]`.

  Returns:
    `(packed, rope)`: uint8 `[..., 512]` (448 fp8 e4m3fn bytes, 14 e8m0 bytes holding each tile's
    scale twice, 50 zero padding bytes) and bf16 `[..., 64]` (dims 448..511).

  Quantization follows FlashMLA's MODEL1 convention exactly, so the same f32 input gives the same
  bytes as any other correct implementation: per 64-value tile,
  `scale = 2^ceil(log2(max(amax / 448, 1e-4)))`, then `cast_e4m3fn(x / scale)` (round to nearest
  even; `|x / scale| <= 448` by construction).
  """
  _check_last_dim("x", x, HEAD_DIM, (jnp.float32, jnp.bfloat16))
  x = x.astype(jnp.float32)
  nope, rope = x[..., :NOPE_DIM], x[..., NOPE_DIM:]
  exponent = tile_scale_exponents(nope)
  # ldexp of 1 is exact; the division by a power of two is exact for these magnitudes.
  scale = jnp.ldexp(jnp.float32(1), exponent)
  tiles = nope.reshape(*nope.shape[:-1], NUM_TILES, TILE) / scale[..., None]
  fp8 = jax.lax.bitcast_convert_type(tiles.astype(jnp.float8_e4m3fn), jnp.uint8)
  fp8 = fp8.reshape(*nope.shape)
  scale_bytes = jnp.repeat((exponent + E8M0_BIAS).astype(jnp.uint8), 2, axis=-1)
  padding = jnp.zeros((*x.shape[:-1], ROW_BYTES - PAD_OFFSET), jnp.uint8)
  packed = jnp.concatenate([fp8, scale_bytes, padding], axis=-1)
  return packed, rope.astype(jnp.bfloat16)


def dequantize_nope(packed: jax.Array) -> jax.Array:
  """The 448 NoPE values of packed rows, f32 `[..., 448]`.

  Reads bytes 0..447 and the first copy of each scale (byte 448 + 2t) only: the duplicate scale
  bytes and the padding never influence the result. An e8m0 byte of 0xFF gives NaN.
  """
  _check_last_dim("packed", packed, ROW_BYTES, (jnp.uint8,))
  fp8 = jax.lax.bitcast_convert_type(packed[..., :NOPE_DIM], jnp.float8_e4m3fn)
  values = fp8.astype(jnp.float32).reshape(*packed.shape[:-1], NUM_TILES, TILE)
  scale_bytes = packed[..., SCALE_OFFSET:PAD_OFFSET:2]
  scales = jax.lax.bitcast_convert_type(scale_bytes, jnp.float8_e8m0fnu).astype(jnp.float32)
  return (values * scales[..., None]).reshape(*packed.shape[:-1], NOPE_DIM)


def unpack_rows(packed: jax.Array, rope: jax.Array, dtype=jnp.float32) -> jax.Array:
  """Dequantizes packed rows back to `[..., 512]` values of `dtype`.

  Args:
    packed: uint8 `[..., 512]`; only bytes 0..461 are read.
    rope: bf16 `[..., 64]` with the same leading dims.
    dtype: the result dtype (f32 by default; the values are exact in f32).
  """
  _check_last_dim("rope", rope, ROPE_DIM, (jnp.bfloat16,))
  nope = dequantize_nope(packed)
  if packed.shape[:-1] != rope.shape[:-1]:
    raise ValueError(
        f"packed and rope must have the same leading dims; got {tuple(packed.shape)} and "
        f"{tuple(rope.shape)}")
  return jnp.concatenate([nope, rope.astype(jnp.float32)], axis=-1).astype(dtype)


def to_flashmla(packed: jax.Array, rope: jax.Array, block_size: int = 64) -> jax.Array:
  """Converts packed rows `[R, 512]` + rope `[R, 64]` to FlashMLA's MODEL1_FP8Sparse cache.

  Args:
    packed: uint8 `[R, 512]` packed rows (`pack_rows`); bytes 462..511 are not read.
    rope: bf16 `[R, 64]`.
    block_size: tokens per FlashMLA cache block; R must be a multiple of it.

  Returns uint8 `[R // block_size, block_size, 1, 584]`, the shape FlashMLA's k_cache has; within
  each block the bytes are `block_size x (448 fp8 + 128 RoPE bytes)` followed by
  `block_size x (7 e8m0 + 1 zero pad)`, so the "584-byte rows" of that shape are not tokens.
  A pure byte shuffle: no value is requantized.
  """
  _check_last_dim("packed", packed, ROW_BYTES, (jnp.uint8,))
  _check_last_dim("rope", rope, ROPE_DIM, (jnp.bfloat16,))
  if packed.ndim != 2 or rope.shape != (packed.shape[0], ROPE_DIM):
    raise ValueError(
        f"to_flashmla takes packed [R, 512] and rope [R, 64]; got {tuple(packed.shape)} and "
        f"{tuple(rope.shape)}")
  rows = packed.shape[0]
  if block_size < 1 or rows % block_size:
    raise ValueError(f"the number of rows ({rows}) must be a multiple of block_size ({block_size})")
  blocks = rows // block_size
  rope_bytes = jax.lax.bitcast_convert_type(rope, jnp.uint8).reshape(rows, 2 * ROPE_DIM)
  data = jnp.concatenate([packed[:, :NOPE_DIM], rope_bytes], axis=-1)
  scales = jnp.concatenate(
      [packed[:, SCALE_OFFSET:PAD_OFFSET:2], jnp.zeros((rows, 1), jnp.uint8)], axis=-1)
  data = data.reshape(blocks, block_size * FLASHMLA_TOKEN_DATA_BYTES)
  scales = scales.reshape(blocks, block_size * FLASHMLA_TOKEN_SCALE_BYTES)
  return jnp.concatenate([data, scales], axis=-1).reshape(
      blocks, block_size, 1, FLASHMLA_BYTES_PER_TOKEN)


def from_flashmla(cache: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Converts FlashMLA's MODEL1_FP8Sparse cache `[blocks, block_size, 1, 584]` to packed rows.

  Returns `(packed uint8 [blocks * block_size, 512], rope bf16 [blocks * block_size, 64])` with
  each scale written twice and zero padding; FlashMLA's pad byte is not read.
  """
  if cache.dtype != jnp.uint8:
    raise TypeError(f"cache must have dtype uint8; got {cache.dtype}")
  if cache.ndim != 4 or cache.shape[2] != 1 or cache.shape[3] != FLASHMLA_BYTES_PER_TOKEN:
    raise ValueError(
        f"cache must have shape [blocks, block_size, 1, {FLASHMLA_BYTES_PER_TOKEN}]; got "
        f"{tuple(cache.shape)}")
  blocks, block_size = cache.shape[:2]
  rows = blocks * block_size
  flat = cache.reshape(blocks, block_size * FLASHMLA_BYTES_PER_TOKEN)
  split = block_size * FLASHMLA_TOKEN_DATA_BYTES
  data = flat[:, :split].reshape(rows, FLASHMLA_TOKEN_DATA_BYTES)
  scales = flat[:, split:].reshape(rows, FLASHMLA_TOKEN_SCALE_BYTES)[:, :NUM_TILES]
  rope = jax.lax.bitcast_convert_type(
      data[:, NOPE_DIM:].reshape(rows, ROPE_DIM, 2), jnp.bfloat16)
  padding = jnp.zeros((rows, ROW_BYTES - PAD_OFFSET), jnp.uint8)
  packed = jnp.concatenate([data[:, :NOPE_DIM], jnp.repeat(scales, 2, axis=-1), padding], axis=-1)
  return packed, rope
