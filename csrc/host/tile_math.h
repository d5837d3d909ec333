// SIMD pieces both attention kernel families use (host/attention_tile.cc, host/tile_bf16.cc):
// the packed row's dequantization, a vector exp, and the online-softmax step over a tile of
// scores. Written with GCC/Clang vector extensions and forced inline, so each kernel function
// compiles them for its own instruction set (its target attribute or clone); everything here
// has internal linkage, so no out-of-line copy built for one instruction set can be picked by
// the linker for another.
#ifndef JAX_MLA_HOST_TILE_MATH_H_
#define JAX_MLA_HOST_TILE_MATH_H_

#include <cstdint>
#include <cstring>
#include <limits>

#include "host/row_format.h"

#define JAX_MLA_INLINE inline __attribute__((always_inline))

namespace jax_mla::host {
namespace {  // NOLINT: internal linkage on purpose (see above)

typedef float V8 __attribute__((vector_size(32), aligned(4), may_alias));
typedef std::uint32_t U8 __attribute__((vector_size(32), aligned(4), may_alias));
typedef std::int32_t M8 __attribute__((vector_size(32)));  // comparison masks
typedef std::uint8_t B8 __attribute__((vector_size(8), aligned(1), may_alias));
typedef std::uint16_t H8 __attribute__((vector_size(16), aligned(2), may_alias));

JAX_MLA_INLINE V8 LoadV8(const float* p) { return *reinterpret_cast<const V8*>(p); }
JAX_MLA_INLINE void StoreV8(float* p, V8 v) { *reinterpret_cast<V8*>(p) = v; }
JAX_MLA_INLINE V8 AsFloat(U8 v) { V8 f; std::memcpy(&f, &v, sizeof(f)); return f; }
JAX_MLA_INLINE U8 AsBits(V8 v) { U8 u; std::memcpy(&u, &v, sizeof(u)); return u; }
JAX_MLA_INLINE V8 Splat(float x) { return V8{x, x, x, x, x, x, x, x}; }
JAX_MLA_INLINE U8 SplatU(std::uint32_t x) { return U8{x, x, x, x, x, x, x, x}; }

// exp(x) for 8 lanes, Cephes' single-precision polynomial (about 1 ulp against std::exp).
// exp(-inf) = 0, NaN stays NaN; below ln(2^-126) it returns 0 where std::exp would return a
// denormal (an absolute difference under 1.2e-38).
JAX_MLA_INLINE V8 Exp(V8 x) {
  const V8 lo = Splat(-87.33654475f), hi = Splat(88.37626266f);
  V8 xc = x < lo ? lo : x;  // NaN compares false: it passes through
  xc = xc > hi ? hi : xc;
  const V8 magic = Splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const V8 shifted = xc * Splat(1.44269504088896341f) + magic;
  const U8 n = AsBits(shifted) - AsBits(magic);  // round(x / ln 2), two's complement
  const V8 fn = shifted - magic;
  V8 r = xc - fn * Splat(0.693359375f);
  r = r - fn * Splat(-2.12194440e-4f);
  V8 p = Splat(1.9875691500e-4f);
  p = p * r + Splat(1.3981999507e-3f);
  p = p * r + Splat(8.3334519073e-3f);
  p = p * r + Splat(4.1665795894e-2f);
  p = p * r + Splat(1.6666665459e-1f);
  p = p * r + Splat(5.0000001201e-1f);
  p = p * (r * r) + r + Splat(1.0f);
  V8 y = p * AsFloat((n + SplatU(127)) << 23);
  y = x < lo ? Splat(0.0f) : y;
  y = x > hi ? Splat(std::numeric_limits<float>::infinity()) : y;
  return y;
}

// 16 lanes, for the AVX-512 kernels (only ever inlined into functions compiled for them).
typedef float V16 __attribute__((vector_size(64), aligned(4), may_alias));
typedef std::uint32_t U16 __attribute__((vector_size(64), aligned(4), may_alias));
typedef std::uint8_t B16 __attribute__((vector_size(16), aligned(1), may_alias));
typedef std::uint16_t H16 __attribute__((vector_size(32), aligned(2), may_alias));

// Lanes e4m3fn bytes to floats, exactly DecodeE4m3fn's values (NaN for S.1111.111, as a
// positive quiet NaN), times the tile scale. VF/VU/VB: float, u32 and u8 vectors of one width.
template <typename VF, typename VU, typename VB>
JAX_MLA_INLINE VF E4m3TimesN(const std::uint8_t* src, float scale) {
  const VU b = __builtin_convertvector(*reinterpret_cast<const VB*>(src), VU);
  const VU mag = b & 0x7F;
  const VU normal = (mag << 20) + (120u << 23);  // exponent E - 7 + 127, mantissa m
  VF sub_value = __builtin_convertvector(mag, VF) * (1.0f / 512);  // m 2^-9
  VU subnormal;
  std::memcpy(&subnormal, &sub_value, sizeof(subnormal));
  VU bits = (mag < 8) ? subnormal : normal;
  bits |= (b & 0x80) << 24;
  bits = (mag == 0x7F) ? (mag - mag + 0x7FC00000u) : bits;
  VF value;
  std::memcpy(&value, &bits, sizeof(value));
  return value * scale;
}

JAX_MLA_INLINE V8 E4m3Times(const std::uint8_t* src, float scale) {
  return E4m3TimesN<V8, U8, B8>(src, scale);
}

JAX_MLA_INLINE float ScaleOf(const std::uint8_t* packed, int tile) {
  return DecodeE8m0(packed[kFirstScaleByte + 2 * tile]);
}

// One packed row (and its bf16 RoPE) to 512 floats: DequantizeRow's values.
JAX_MLA_INLINE void DequantizeRowF32(const std::uint8_t* packed, const std::uint16_t* rope,
                                     float* out) {
  for (int tile = 0; tile < kScaleTiles; ++tile) {
    const float scale = ScaleOf(packed, tile);
    for (int i = 0; i < kScaleTileDim; i += 8) {
      StoreV8(out + kScaleTileDim * tile + i, E4m3Times(packed + kScaleTileDim * tile + i, scale));
    }
  }
  for (int i = 0; i < kRopeDim; i += 8) {
    const U8 bits = __builtin_convertvector(*reinterpret_cast<const H8*>(rope + i), U8) << 16;
    StoreV8(out + kNopeDim + i, AsFloat(bits));
  }
}

// The same row as bf16 bit patterns (16 lanes: called only from the AVX-512 kernels). Exact: an e4m3 value times a power of two has 4
// significant bits, so dropping the low 16 bits of its float loses nothing (float denormals
// below 2^-133 aside, which become 0). The RoPE bits are copied.
JAX_MLA_INLINE void DequantizeRowBf16(const std::uint8_t* packed, const std::uint16_t* rope,
                                      std::uint16_t* out) {
  for (int tile = 0; tile < kScaleTiles; ++tile) {
    const float scale = ScaleOf(packed, tile);
    for (int i = 0; i < kScaleTileDim; i += 16) {
      const V16 value = E4m3TimesN<V16, U16, B16>(packed + kScaleTileDim * tile + i, scale);
      U16 bits;
      std::memcpy(&bits, &value, sizeof(bits));
      *reinterpret_cast<H16*>(out + kScaleTileDim * tile + i) =
          __builtin_convertvector(bits >> 16, H16);
    }
  }
  std::memcpy(out + kNopeDim, rope, sizeof(std::uint16_t) * kRopeDim);
}

// Asks the caches (L2) for one packed KV row and its RoPE.
JAX_MLA_INLINE void PrefetchRow(const std::uint8_t* kv, const std::uint16_t* kv_rope,
                                std::int64_t row) {
  const char* packed = reinterpret_cast<const char*>(kv + static_cast<std::size_t>(row) * kRowBytes);
  for (int line = 0; line < kFirstScaleByte + 2 * kScaleTiles; line += 64) {
    __builtin_prefetch(packed + line, 0, 2);
  }
  const char* rope = reinterpret_cast<const char*>(kv_rope + static_cast<std::size_t>(row) * kRopeDim);
  __builtin_prefetch(rope, 0, 2);
  __builtin_prefetch(rope + 64, 0, 2);
}

// The next tile's rows, gathered from anywhere in the pool, asked for a few at a time while this
// tile computes: a whole tile's lines at once (about a thousand) overflow the outstanding-miss
// queue, and most of those prefetches would be dropped.
struct RowPrefetch {
  const std::uint8_t* kv;
  const std::uint16_t* kv_rope;
  const std::int32_t* ids;
  int count;
  int done = 0;

  JAX_MLA_INLINE void Next(int rows) {
    for (; rows > 0 && done < count; --rows, ++done) PrefetchRow(kv, kv_rope, ids[done]);
  }
};

// float -> bf16 bits, round to nearest even (NaN stays NaN): the weights of the bf16 kernels.
JAX_MLA_INLINE U8 RoundToBf16Bits(V8 v) {
  const U8 bits = AsBits(v);
  return (bits + SplatU(0x7FFF) + ((bits >> 16) & 1)) >> 16;
}

// The online-softmax step of one tile, 8 query rows at a time. scores [tokens][stride] holds the
// scaled scores of this tile (stride = rows padded to a multiple of 8; columns past the block's
// rows are computed and ignored). For each row:
//   new_max = max(max, max_j s_j) (a NaN score is skipped here and reaches sum and acc below),
//   correction = exp(max - new_max) (0 while nothing was seen),
//   p_j = exp(s_j - new_max), sum = sum * correction + sum_j p_j,
//   weight_sum = weight_sum * correction + sum_j w_j, w_j the weight PV uses:
// kBf16Weights false: w_j = p_j, written over the scores. true: w_j = bf16(p_j), written as
// pairs (w_2i | w_2i+1 << 16) to pairs[i][stride], with w = 0 past the last token.
template <bool kBf16Weights>
JAX_MLA_INLINE void SoftmaxStep(float* scores, int stride, int rows, int tokens, float* max,
                                float* sum, float* weight_sum, float* correction,
                                std::uint32_t* pairs) {
  const V8 neg_inf = Splat(-std::numeric_limits<float>::infinity());
  for (int r = 0; r < rows; r += 8) {
    const V8 old_max = LoadV8(max + r);
    V8 tile_max = neg_inf;
    for (int j = 0; j < tokens; ++j) {
      const V8 s = LoadV8(scores + static_cast<std::size_t>(j) * stride + r);
      tile_max = tile_max < s ? s : tile_max;
    }
    const V8 new_max = old_max < tile_max ? tile_max : old_max;
    const V8 c = old_max == neg_inf ? Splat(0.0f) : Exp(old_max - new_max);
    V8 tile_sum = Splat(0.0f), tile_weights = Splat(0.0f);
    if constexpr (kBf16Weights) {
      for (int j = 0; j < tokens; j += 2) {
        const V8 p0 = Exp(LoadV8(scores + static_cast<std::size_t>(j) * stride + r) - new_max);
        V8 p1 = Splat(0.0f);
        if (j + 1 < tokens) {
          p1 = Exp(LoadV8(scores + static_cast<std::size_t>(j + 1) * stride + r) - new_max);
        }
        const U8 w0 = RoundToBf16Bits(p0), w1 = RoundToBf16Bits(p1);
        tile_sum += p0;
        tile_sum += p1;
        tile_weights += AsFloat(w0 << 16);
        tile_weights += AsFloat(w1 << 16);
        *reinterpret_cast<U8*>(pairs + static_cast<std::size_t>(j / 2) * stride + r) =
            w0 | (w1 << 16);
      }
    } else {
      for (int j = 0; j < tokens; ++j) {
        float* row = scores + static_cast<std::size_t>(j) * stride + r;
        const V8 p = Exp(LoadV8(row) - new_max);
        tile_sum += p;
        StoreV8(row, p);
      }
      tile_weights = tile_sum;
    }
    StoreV8(sum + r, LoadV8(sum + r) * c + tile_sum);
    StoreV8(weight_sum + r, LoadV8(weight_sum + r) * c + tile_weights);
    StoreV8(max + r, new_max);
    StoreV8(correction + r, c);
  }
}

}  // namespace
}  // namespace jax_mla::host

#endif  // JAX_MLA_HOST_TILE_MATH_H_
