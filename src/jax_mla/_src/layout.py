"""The packed fp8 row format of DeepSeek-V4 MLA decode (KERNELS.md section 2), in JAX.

A Q or KV row is 512 values: dims 0..447 ("NoPE") are stored as 448 fp8 e4m3fn bytes with one
power-of-two e8m0 scale per 64-value tile, dims 448..511 ("RoPE") as 64 bf16 values in a separate
buffer. The 512-byte packed row:

  bytes 0..447    fp8 e4m3fn values
  bytes 448..461  7 e8m0 scales, each stored twice: s0 s0 s1 s1 ... s6 s6
  bytes 462..511  padding: undefined content, never read

Everything here is jittable and shape-polymorphic over leading dims. The same rows in other
servers' byte orders: `to_flashmla` / `from_flashmla` (FlashMLA's MODEL1_FP8Sparse cache),
`to_tpu_inference` / `from_tpu_inference` (tpu-inference's DeepSeek-V4 CSA cache).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

HEAD_DIM = 512
NOPE_DIM = 448
ROPE_DIM = 64
# The softmax scale AMD's kernels hard-wire; decode's default.
DEFAULT_SOFTMAX_SCALE = 1.0 / HEAD_DIM ** 0.5
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


def _check_converter_rows(caller: str, packed, rope) -> int:
  """The rows a converter to another server's cache takes: packed uint8 `[R, 512]` and rope bf16
  `[R, 64]`; returns R."""
  _check_last_dim("packed", packed, ROW_BYTES, (jnp.uint8,))
  _check_last_dim("rope", rope, ROPE_DIM, (jnp.bfloat16,))
  if packed.ndim != 2 or rope.shape != (packed.shape[0], ROPE_DIM):
    raise ValueError(
        f"{caller} takes packed [R, 512] and rope [R, 64]; got {tuple(packed.shape)} and "
        f"{tuple(rope.shape)}")
  return packed.shape[0]


def _check_rows_multiple(rows: int, name: str, size) -> None:
  """R fills whole cache blocks (pages) of `size` rows."""
  if size < 1 or rows % size:
    raise ValueError(f"the number of rows ({rows}) must be a multiple of {name} ({size})")


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
  rows = _check_converter_rows("to_flashmla", packed, rope)
  _check_rows_multiple(rows, "block_size", block_size)
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


# tpu-inference's DeepSeek-V4 CSA cache (vllm-project/tpu-inference): two uint8 arrays per layer,
# a NoPE array [pages, page_size, 4, 128] (512 bytes per token) and a RoPE array
# [pages, page_size // 4, 4, 128] (128 bytes per token). Layout in to_tpu_inference's docstring.
TPU_INFERENCE_NOPE_BYTES = 512
TPU_INFERENCE_PAD_OFFSET = SCALE_OFFSET + NUM_TILES  # 455
TPU_INFERENCE_ROPE_BYTES = 2 * ROPE_DIM  # 128
TPU_INFERENCE_LANES = 128
TPU_INFERENCE_PACKING = 4  # 128-byte lane rows per NoPE record; RoPE records per rope-array row


def _check_tpu_inference_page_size(page_size) -> None:
  if isinstance(page_size, bool) or not isinstance(page_size, (int, np.integer)):
    raise TypeError(f"page_size must be a static positive int; got {page_size!r} of type "
                    f"{type(page_size).__name__}")
  if page_size < 1 or page_size % TPU_INFERENCE_PACKING:
    raise ValueError(f"page_size must be a positive multiple of {TPU_INFERENCE_PACKING} (the "
                     f"RoPE array holds {TPU_INFERENCE_PACKING} tokens per row); got {page_size}")


def to_tpu_inference(packed: jax.Array, rope: jax.Array,
                     page_size: int) -> tuple[jax.Array, jax.Array]:
  """Converts packed rows `[R, 512]` + rope `[R, 64]` to tpu-inference's DeepSeek-V4 CSA cache.

  tpu-inference (vllm-project/tpu-inference, read at commit b8692ff, 2026-08-22) keeps the
  compressed (CSA) KV of a layer in two uint8 arrays, written by its compressor
  (`compress_and_store/compute.py`: `pack_nope_tiled`, `pack_rope_tiled`; pure-JAX reference
  `compress_store_ref.py`) and read by `sparse_ragged_paged_attention` (`core_attention/
  sparse_mla.py`, through `csa_gather.py`):

  - NoPE array, uint8 `[pages, page_size, 4, 128]`: token `(p, s)`'s 512-byte record is
    `nope_cache[p, s].reshape(512)`:

      bytes 0..447    448 fp8 e4m3fn values (the same bytes as jax_mla's row)
      bytes 448..454  7 e8m0 tile scales, each once (jax_mla stores each twice)
      bytes 455..511  57 padding bytes: tpu-inference writes zeros and never reads them

  - RoPE array, uint8 `[pages, page_size // 4, 4, 128]`: token `(p, s)`'s 128-byte record is
    `rope_cache[p, s // 4, s % 4]`, i.e. row `p * page_size + s` of
    `rope_cache.reshape(-1, 128)`. Its 64 bf16 values are stored as byte planes: byte `j` is the
    high byte and byte `64 + j` the low byte of value `j`'s bits (`bits = hi << 8 | lo`, an
    arithmetic split, so no byte order of the machine enters).

  Pool row `r` is token `(r // page_size, r % page_size)`: the flat row numbering
  `page * page_size + slot` that tpu-inference itself uses for the gather, so a pool index stays
  valid on both sides. tpu-inference's page size is vLLM's block size divided by the CSA
  compression ratio 4, a multiple of 4.

  Quantization: tpu-inference's quantizer (`quantize_fp8_ue8m0` in `compress_store_ref.py`,
  `quantize_fp8_tiled` in the compressor kernel) clamps the tile's amax before the division,
  `2^ceil(log2(max(amax, 1e-4) / 448))`, where `pack_rows` uses FlashMLA's
  `2^ceil(log2(max(amax / 448, 1e-4)))`. Both give the same bytes for a tile with
  `amax > 448 * 2^-14` (0.0273); for smaller tiles tpu-inference's scale is smaller (down to
  2^-22 against 2^-13), so its bytes differ (both decode within their own error bound). Its
  exponent comes from f32 `log2` and `ceil`, `pack_rows`'s from the exact `frexp`; they agreed on
  XLA:CPU, including tiles whose amax / 448 is a power of two. RoPE is the bf16 rounding of the
  f32 value on both sides.

  Args:
    packed: uint8 `[R, 512]` packed rows (`pack_rows`); bytes 462..511 and the second copy of
      each scale are not read.
    rope: bf16 `[R, 64]`.
    page_size: tokens per page, static; a positive multiple of 4 that divides R.

  Returns:
    `(nope_cache uint8 [R // page_size, page_size, 4, 128],
    rope_cache uint8 [R // page_size, page_size // 4, 4, 128])`, padding zero. A pure byte
    shuffle: no value is requantized, so `from_tpu_inference` gives the rows back bit for bit.
  """
  rows = _check_converter_rows("to_tpu_inference", packed, rope)
  _check_tpu_inference_page_size(page_size)
  _check_rows_multiple(rows, "page_size", page_size)
  pages = rows // page_size
  padding = jnp.zeros((rows, TPU_INFERENCE_NOPE_BYTES - TPU_INFERENCE_PAD_OFFSET), jnp.uint8)
  nope = jnp.concatenate(
      [packed[:, :NOPE_DIM], packed[:, SCALE_OFFSET:PAD_OFFSET:2], padding], axis=-1)
  bits = jax.lax.bitcast_convert_type(rope, jnp.uint16)
  planes = jnp.concatenate(
      [(bits >> 8).astype(jnp.uint8), (bits & 0xFF).astype(jnp.uint8)], axis=-1)
  nope_cache = nope.reshape(pages, page_size, TPU_INFERENCE_PACKING, TPU_INFERENCE_LANES)
  rope_cache = planes.reshape(pages, page_size // TPU_INFERENCE_PACKING, TPU_INFERENCE_PACKING,
                              TPU_INFERENCE_LANES)
  return nope_cache, rope_cache


def from_tpu_inference(nope_cache: jax.Array,
                       rope_cache: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Converts tpu-inference's DeepSeek-V4 CSA cache (NoPE and RoPE arrays) to packed rows.

  Args:
    nope_cache: uint8 `[pages, page_size, 4, 128]`; only bytes 0..454 of each token's 512-byte
      record are read (the padding 455..511 never is).
    rope_cache: uint8 `[pages, page_size // 4, 4, 128]`: 64 high bytes then 64 low bytes of
      each token's bf16 RoPE values. The byte layout of both is in `to_tpu_inference`'s
      docstring.

  Returns:
    `(packed uint8 [pages * page_size, 512], rope bf16 [pages * page_size, 64])`, pool row
    `p * page_size + s` from token `(p, s)`, each scale written twice and zero padding. A pure
    byte shuffle.
  """
  for name, cache in (("nope_cache", nope_cache), ("rope_cache", rope_cache)):
    if not (hasattr(cache, "shape") and hasattr(cache, "dtype")):
      raise TypeError(f"{name} must be an array (jax or numpy); got {type(cache).__name__}")
    if cache.dtype != jnp.uint8:
      raise TypeError(f"{name} must have dtype uint8; got {cache.dtype}")
  if (nope_cache.ndim != 4 or nope_cache.shape[2:] != (TPU_INFERENCE_PACKING, TPU_INFERENCE_LANES)
      or nope_cache.shape[1] % TPU_INFERENCE_PACKING):
    raise ValueError(
        f"nope_cache must have shape [pages, page_size, 4, 128] with page_size a multiple of 4; "
        f"got {tuple(nope_cache.shape)}")
  pages, page_size = nope_cache.shape[:2]
  want = (pages, page_size // TPU_INFERENCE_PACKING, TPU_INFERENCE_PACKING, TPU_INFERENCE_LANES)
  if tuple(rope_cache.shape) != want:
    raise ValueError(f"rope_cache must have shape [pages, page_size // 4, 4, 128] = {want} for "
                     f"nope_cache {tuple(nope_cache.shape)}; got {tuple(rope_cache.shape)}")
  rows = pages * page_size
  nope = nope_cache.reshape(rows, TPU_INFERENCE_NOPE_BYTES)
  planes = rope_cache.reshape(rows, TPU_INFERENCE_ROPE_BYTES).astype(jnp.uint16)
  bits = (planes[:, :ROPE_DIM] << 8) | planes[:, ROPE_DIM:]
  rope = jax.lax.bitcast_convert_type(bits, jnp.bfloat16)
  padding = jnp.zeros((rows, ROW_BYTES - PAD_OFFSET), jnp.uint8)
  packed = jnp.concatenate(
      [nope[:, :NOPE_DIM], jnp.repeat(nope[:, SCALE_OFFSET:TPU_INFERENCE_PAD_OFFSET], 2, axis=-1),
       padding], axis=-1)
  return packed, rope
