"""The packed row format: hand-computed bytes, round-trip bounds, NaN scales, FlashMLA order."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_mla
from support.oracle import bf16_to_f64, dequantize_rows, e4m3fn_to_f64, e8m0_to_f64


def _hand_row():
  """One row whose bytes were worked out by hand from KERNELS.md section 2."""
  x = np.zeros(512, np.float32)
  # tile 0: all zero -> ratio clamps to 1e-4 -> scale 2^ceil(log2 1e-4) = 2^-13 -> byte 114.
  # tile 1: amax 0.0224 -> 0.0224/448 = 5e-5 < 1e-4 -> clamp -> 2^-13; 0.0224 * 2^13 = 183.5,
  #         which e4m3fn rounds to 176 = 1.375 * 2^7 -> 0 1110 011 = 0x73 (negative: 0xF3).
  x[64], x[65] = 0.0224, -0.0224
  # tile 2: amax 896 = 448 * 2^1 exactly -> scale 2^1 -> byte 128; 896/2 = 448 = 1.75 * 2^8 ->
  #         0 1111 110 = 0x7E; 2.0/2 = 1.0 -> 0x38; 1.0/2 = 0.5 -> 0x30; -896 -> 0xFE.
  x[128:132] = [896.0, -896.0, 2.0, 1.0]
  # tile 3: amax 3 -> 3/448 = 0.0067 -> ceil(log2) = -7 -> byte 120; 3 * 2^7 = 384 = 1.5 * 2^8
  #         -> 0 1111 100 = 0x7C.
  x[192] = 3.0
  x[448:] = np.arange(64, dtype=np.float32) / 8.0  # RoPE, exact in bf16
  expected = np.zeros(512, np.uint8)
  expected[64], expected[65] = 0x73, 0xF3
  expected[128:132] = [0x7E, 0xFE, 0x38, 0x30]
  expected[192] = 0x7C
  scales = [114, 114, 128, 120, 114, 114, 114]
  expected[448:462] = np.repeat(scales, 2)
  return x, expected


def test_hand_computed_bytes():
  x, expected = _hand_row()
  packed, rope = jax.jit(jax_mla.pack_rows)(jnp.asarray(x))
  np.testing.assert_array_equal(np.asarray(packed), expected)
  np.testing.assert_array_equal(np.asarray(rope, np.float32), x[448:])


def test_bf16_input_gives_bytes_of_its_f32_value():
  x = np.random.default_rng(0).standard_normal((4, 512)).astype(ml_dtypes.bfloat16)
  a, ra = jax_mla.pack_rows(jnp.asarray(x))
  b, rb = jax_mla.pack_rows(jnp.asarray(x.astype(np.float32)))
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_array_equal(np.asarray(ra, np.float32), np.asarray(rb, np.float32))


def test_padding_is_zero_and_scales_are_duplicated():
  x = np.random.default_rng(1).standard_normal((3, 5, 512)).astype(np.float32) * 10
  packed = np.asarray(jax_mla.pack_rows(jnp.asarray(x))[0])
  assert packed.shape == (3, 5, 512)
  assert not packed[..., 462:].any()
  np.testing.assert_array_equal(packed[..., 448:462:2], packed[..., 449:462:2])


@pytest.mark.parametrize("magnitude", [1e-6, 1e-3, 1.0, 300.0, 1e5])
def test_round_trip_within_e4m3_bound_per_tile(magnitude):
  rng = np.random.default_rng(2)
  x = rng.standard_normal((16, 512)).astype(np.float32) * magnitude
  x[:, 64:128] *= 37.0  # tiles of different scale in one row
  packed, rope = jax_mla.pack_rows(jnp.asarray(x))
  y = np.asarray(jax_mla.unpack_rows(packed, rope))
  assert np.isfinite(y).all()
  # The unpacked values equal the oracle's bit-level decoding of the same bytes.
  np.testing.assert_array_equal(y, dequantize_rows(np.asarray(packed), np.asarray(rope)))
  scale = np.exp2(np.asarray(packed)[:, 448:462:2].astype(np.float64) - 127)  # [16, 7]
  tile_scale = np.repeat(scale, 64, axis=1)
  # e4m3fn: 3 mantissa bits -> half-ulp relative error 2^-4 for normals; subnormal spacing
  # 2^-9 -> absolute error <= scale * 2^-10.
  bound = np.maximum(np.abs(x[:, :448]) * 2.0**-4, tile_scale * 2.0**-10)
  err = np.abs(y[:, :448] - x[:, :448])
  assert (err <= bound * (1 + 1e-6)).all(), float((err / bound).max())
  # And the scale is the smallest power of two keeping |x / scale| <= 448.
  amax = np.abs(x[:, :448]).reshape(16, 7, 64).max(-1)
  assert (amax / scale <= 448).all()
  assert ((amax / (scale / 2) > 448) | (scale / 2 < 1e-4)).all()
  np.testing.assert_array_equal(y[:, 448:], x[:, 448:].astype(ml_dtypes.bfloat16).astype(np.float32))


def test_scale_byte_ff_dequantizes_to_nan():
  x = np.ones((1, 512), np.float32)
  packed, rope = jax_mla.pack_rows(jnp.asarray(x))
  packed = np.asarray(packed).copy()
  packed[0, 448 + 2 * 3] = 0xFF  # tile 3's first (read) copy
  y = np.asarray(jax_mla.unpack_rows(jnp.asarray(packed), rope))
  assert np.isnan(y[0, 192:256]).all()
  assert np.isfinite(np.delete(y[0], np.arange(192, 256))).all()


def test_duplicate_scale_and_padding_bytes_are_not_read():
  x = np.random.default_rng(3).standard_normal((4, 512)).astype(np.float32)
  packed, rope = jax_mla.pack_rows(jnp.asarray(x))
  poisoned = np.asarray(packed).copy()
  poisoned[:, 449:462:2] = 0xFF  # second copies
  poisoned[:, 462:] = 0xFF
  a = np.asarray(jax_mla.unpack_rows(packed, rope))
  b = np.asarray(jax_mla.unpack_rows(jnp.asarray(poisoned), rope))
  np.testing.assert_array_equal(a, b)


def test_non_finite_input_gives_nan_scale():
  x = np.ones((1, 512), np.float32)
  x[0, 70] = np.inf
  packed, rope = jax_mla.pack_rows(jnp.asarray(x))
  assert np.asarray(packed)[0, 450] == 0xFF and np.asarray(packed)[0, 448] != 0xFF
  assert np.isnan(np.asarray(jax_mla.unpack_rows(packed, rope))[0, 64:128]).all()


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_flashmla_byte_order_round_trips(block_size):
  rng = np.random.default_rng(4)
  x = rng.standard_normal((128, 512)).astype(np.float32)
  packed, rope = jax_mla.pack_rows(jnp.asarray(x))
  cache = np.asarray(jax.jit(jax_mla.to_flashmla, static_argnums=2)(packed, rope, block_size))
  assert cache.shape == (128 // block_size, block_size, 1, 584) and cache.dtype == np.uint8
  # Independent reading of FlashMLA's block layout: data region, then scale region.
  flat = cache.reshape(128 // block_size, -1)
  data = flat[:, :block_size * 576].reshape(128, 576)
  scales = flat[:, block_size * 576:].reshape(128, 8)
  np.testing.assert_array_equal(data[:, :448], np.asarray(packed)[:, :448])
  np.testing.assert_array_equal(data[:, 448:].view(ml_dtypes.bfloat16), np.asarray(rope))
  np.testing.assert_array_equal(scales[:, :7], np.asarray(packed)[:, 448:462:2])
  assert not scales[:, 7].any()
  back, back_rope = jax_mla.from_flashmla(jnp.asarray(cache))
  np.testing.assert_array_equal(np.asarray(back), np.asarray(packed))
  np.testing.assert_array_equal(np.asarray(back_rope), np.asarray(rope))


def test_layout_errors_name_the_argument():
  with pytest.raises(ValueError, match="x must have a last dimension of 512"):
    jax_mla.pack_rows(jnp.zeros((2, 511)))
  with pytest.raises(TypeError, match="x must have dtype"):
    jax_mla.pack_rows(jnp.zeros((2, 512), jnp.int32))
  with pytest.raises(TypeError, match="packed must have dtype uint8"):
    jax_mla.unpack_rows(jnp.zeros((2, 512), jnp.int8), jnp.zeros((2, 64), jnp.bfloat16))
  with pytest.raises(ValueError, match="multiple of block_size"):
    jax_mla.to_flashmla(jnp.zeros((3, 512), jnp.uint8), jnp.zeros((3, 64), jnp.bfloat16), 2)
  with pytest.raises(ValueError, match=r"cache must have shape \[blocks, block_size, 1, 584\]"):
    jax_mla.from_flashmla(jnp.zeros((2, 4, 1, 512), jnp.uint8))


# tpu-inference's DeepSeek-V4 CSA cache, as read from its source (to_tpu_inference's docstring):
# NoPE array uint8 [pages, page_size, 4, 128], token (p, s) = nope[p, s].reshape(512) = 448 fp8,
# 7 e8m0 scales once, 57 padding bytes; RoPE array uint8 [pages, page_size // 4, 4, 128], token
# (p, s) = rope[p, s // 4, s % 4] = 64 high bytes then 64 low bytes of the bf16 bits.


def _valid_packed(rng, rows):
  """Random packed rows as pack_rows lays them out: any fp8 and scale bytes (NaN codes too),
  each scale twice, zero padding; rope any bf16 bit pattern."""
  packed = rng.integers(0, 256, size=(rows, 512), dtype=np.uint8)
  packed[:, 449:462:2] = packed[:, 448:462:2]
  packed[:, 462:] = 0
  rope = rng.integers(0, 1 << 16, size=(rows, 64), dtype=np.uint16).view(ml_dtypes.bfloat16)
  return packed, rope


def _tpu_inference_tokens(nope_cache, rope_cache):
  """Token records [pages * page_size, 512] and [pages * page_size, 128], page by page."""
  pages, page_size = nope_cache.shape[:2]
  nope = np.stack([nope_cache[p, s].reshape(512) for p in range(pages) for s in range(page_size)])
  rope = np.stack([rope_cache[p, s // 4, s % 4] for p in range(pages) for s in range(page_size)])
  return nope, rope


@pytest.mark.parametrize("page_size", [4, 16, 64])
def test_tpu_inference_round_trips_from_packed_rows(page_size):
  packed, rope = _valid_packed(np.random.default_rng(10), 128)
  to = jax.jit(jax_mla.to_tpu_inference, static_argnums=2)
  nope_cache, rope_cache = to(packed, rope, page_size)
  assert nope_cache.shape == (128 // page_size, page_size, 4, 128) and nope_cache.dtype == np.uint8
  assert rope_cache.shape == (128 // page_size, page_size // 4, 4, 128)
  assert rope_cache.dtype == np.uint8
  back, back_rope = jax.jit(jax_mla.from_tpu_inference)(nope_cache, rope_cache)
  np.testing.assert_array_equal(np.asarray(back), packed)
  np.testing.assert_array_equal(np.asarray(back_rope).view(np.uint16), rope.view(np.uint16))


def test_tpu_inference_round_trips_from_its_cache():
  rng = np.random.default_rng(11)
  nope_cache = rng.integers(0, 256, size=(3, 8, 4, 128), dtype=np.uint8)
  nope_cache.reshape(3, 8, 512)[..., 455:] = 0  # tpu-inference writes zero padding
  rope_cache = rng.integers(0, 256, size=(3, 2, 4, 128), dtype=np.uint8)
  packed, rope = jax.jit(jax_mla.from_tpu_inference)(nope_cache, rope_cache)
  again = jax.jit(jax_mla.to_tpu_inference, static_argnums=2)(packed, rope, 8)
  np.testing.assert_array_equal(np.asarray(again[0]), nope_cache)
  np.testing.assert_array_equal(np.asarray(again[1]), rope_cache)


def test_tpu_inference_hand_built_row():
  # The row of test_hand_computed_bytes (its packed bytes are checked there), RoPE values whose
  # bf16 bits have distinct high and low bytes: 1 + (j + 1) / 128 has bits 0x3F81 + j, so high
  # byte 0x3F, low byte 0x81 + j; value 63 is -2.5 = -1.25 * 2^1: bits 0xC020.
  x, packed_row = _hand_row()
  x[448:] = 1.0 + (np.arange(64) + 1) / 128.0
  x[511] = -2.5
  # Placed at pool row 6 of 12 with page_size 4: page 1, slot 2.
  rows = np.zeros((12, 512), np.float32)
  rows[6] = x
  packed, rope = jax_mla.pack_rows(jnp.asarray(rows))
  np.testing.assert_array_equal(np.asarray(packed)[6], packed_row)
  nope_cache, rope_cache = map(np.asarray, jax_mla.to_tpu_inference(packed, rope, 4))
  want_nope = np.zeros(512, np.uint8)
  want_nope[64], want_nope[65] = 0x73, 0xF3
  want_nope[128:132] = [0x7E, 0xFE, 0x38, 0x30]
  want_nope[192] = 0x7C
  want_nope[448:455] = [114, 114, 128, 120, 114, 114, 114]  # each scale once; 455..511 zero
  want_rope = np.zeros(128, np.uint8)
  want_rope[:64] = 0x3F
  want_rope[64:128] = 0x81 + np.arange(64)
  want_rope[63], want_rope[127] = 0xC0, 0x20
  np.testing.assert_array_equal(nope_cache[1, 2].reshape(512), want_nope)
  np.testing.assert_array_equal(rope_cache[1, 0, 2], want_rope)  # slot 2 -> [2 // 4, 2 % 4]
  # Every other token: all-zero rows -> scale byte 114 (2^-13) in each tile, zero RoPE.
  empty_nope = np.zeros(512, np.uint8)
  empty_nope[448:455] = 114
  nope_tokens, rope_tokens = _tpu_inference_tokens(nope_cache, rope_cache)
  for r in range(12):
    if r != 6:
      np.testing.assert_array_equal(nope_tokens[r], empty_nope)
      assert not rope_tokens[r].any()
  back, back_rope = jax_mla.from_tpu_inference(jnp.asarray(nope_cache), jnp.asarray(rope_cache))
  np.testing.assert_array_equal(np.asarray(back), np.asarray(packed))
  np.testing.assert_array_equal(np.asarray(back_rope, np.float32)[6], x[448:])


def test_tpu_inference_padding_is_never_read():
  x = np.random.default_rng(12).standard_normal((16, 512)).astype(np.float32)
  packed, rope = jax_mla.pack_rows(jnp.asarray(x))
  nope_cache, rope_cache = map(np.asarray, jax_mla.to_tpu_inference(packed, rope, 8))
  poisoned = nope_cache.copy()
  poisoned.reshape(2, 8, 512)[..., 455:] = 0xFF
  a = jax_mla.from_tpu_inference(jnp.asarray(nope_cache), jnp.asarray(rope_cache))
  b = jax_mla.from_tpu_inference(jnp.asarray(poisoned), jnp.asarray(rope_cache))
  np.testing.assert_array_equal(np.asarray(a[0]), np.asarray(b[0]))
  np.testing.assert_array_equal(np.asarray(b[0]), np.asarray(packed))
  # And the other way: jax_mla's padding and second scale copies do not reach the cache.
  dirty = np.asarray(packed).copy()
  dirty[:, 449:462:2] = 0xFF
  dirty[:, 462:] = 0xFF
  c = jax_mla.to_tpu_inference(jnp.asarray(dirty), rope, 8)
  np.testing.assert_array_equal(np.asarray(c[0]), nope_cache)
  np.testing.assert_array_equal(np.asarray(c[1]), rope_cache)


def _decode_tpu_inference_f64(nope_cache, rope_cache):
  """Float64 values [pages * page_size, 512] from tpu-inference's layout, bit by bit."""
  nope, rope = _tpu_inference_tokens(nope_cache, rope_cache)
  values = e4m3fn_to_f64(nope[:, :448]).reshape(-1, 7, 64)
  scales = e8m0_to_f64(nope[:, 448:455])
  bits = (rope[:, :64].astype(np.uint16) << 8) | rope[:, 64:].astype(np.uint16)
  return np.concatenate([(values * scales[..., None]).reshape(-1, 448), bf16_to_f64(bits)], -1)


def test_tpu_inference_values_match_the_oracle():
  rng = np.random.default_rng(13)
  x = rng.standard_normal((32, 512)).astype(np.float32) * np.exp2(rng.integers(-12, 12, (32, 1)))
  x[:, 64:128] *= 1e-3  # small tiles too
  packed, rope = jax_mla.pack_rows(jnp.asarray(x))
  nope_cache, rope_cache = map(np.asarray, jax_mla.to_tpu_inference(packed, rope, 16))
  mine = _decode_tpu_inference_f64(nope_cache, rope_cache)
  np.testing.assert_array_equal(mine, dequantize_rows(np.asarray(packed), np.asarray(rope)))
  # Random bytes, NaN codes and 0xFF scales included: NaN in the same places.
  packed, rope = _valid_packed(rng, 32)
  nope_cache, rope_cache = map(np.asarray, jax_mla.to_tpu_inference(packed, rope, 32))
  with np.errstate(invalid="ignore"):  # signalling-NaN bf16 patterns widen to quiet NaN
    np.testing.assert_array_equal(_decode_tpu_inference_f64(nope_cache, rope_cache),
                                  dequantize_rows(packed, rope))


def test_tpu_inference_errors_name_the_argument():
  packed, rope = jnp.zeros((8, 512), jnp.uint8), jnp.zeros((8, 64), jnp.bfloat16)
  with pytest.raises(ValueError, match="multiple of page_size"):
    jax_mla.to_tpu_inference(packed[:6], rope[:6], 4)
  with pytest.raises(ValueError, match="page_size must be a positive multiple of 4"):
    jax_mla.to_tpu_inference(packed, rope, 2)
  with pytest.raises(TypeError, match="page_size must be a static positive int"):
    jax_mla.to_tpu_inference(packed, rope, 4.0)
  with pytest.raises(TypeError, match="rope must have dtype bfloat16"):
    jax_mla.to_tpu_inference(packed, rope.astype(jnp.float32), 4)
  with pytest.raises(ValueError, match=r"takes packed \[R, 512\] and rope \[R, 64\]"):
    jax_mla.to_tpu_inference(packed, rope[:4], 4)
  nope_cache = jnp.zeros((2, 8, 4, 128), jnp.uint8)
  rope_cache = jnp.zeros((2, 2, 4, 128), jnp.uint8)
  with pytest.raises(TypeError, match="nope_cache must have dtype uint8"):
    jax_mla.from_tpu_inference(nope_cache.astype(jnp.int8), rope_cache)
  with pytest.raises(TypeError, match="rope_cache must have dtype uint8"):
    jax_mla.from_tpu_inference(nope_cache, rope_cache.view(jnp.int8))
  with pytest.raises(ValueError, match=r"nope_cache must have shape \[pages, page_size, 4, 128\]"):
    jax_mla.from_tpu_inference(jnp.zeros((2, 8, 1, 584), jnp.uint8), rope_cache)
  with pytest.raises(ValueError, match=r"nope_cache must have shape"):
    jax_mla.from_tpu_inference(jnp.zeros((2, 6, 4, 128), jnp.uint8), rope_cache)
  with pytest.raises(ValueError, match=r"rope_cache must have shape .* \(2, 2, 4, 128\)"):
    jax_mla.from_tpu_inference(nope_cache, jnp.zeros((2, 8, 4, 128), jnp.uint8))
