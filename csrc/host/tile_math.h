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
JAX_MLA_INLINE V8 Splat(float x) { return V8{x, x, x, x, x, x, x, x}; }

// Generic lane helpers: VF a float vector, VU the u32 vector of the same width.
template <typename VF>
JAX_MLA_INLINE VF SplatN(float x) { return VF{} + x; }
template <typename VU, typename VF>
JAX_MLA_INLINE VU BitsOf(VF v) { VU u; std::memcpy(&u, &v, sizeof(u)); return u; }
template <typename VF, typename VU>
JAX_MLA_INLINE VF FloatsOf(VU v) { VF f; std::memcpy(&f, &v, sizeof(f)); return f; }
template <typename VF>
JAX_MLA_INLINE VF LoadN(const float* p) { VF v; std::memcpy(&v, p, sizeof(v)); return v; }
template <typename VF>
JAX_MLA_INLINE void StoreN(float* p, VF v) { std::memcpy(p, &v, sizeof(v)); }

// exp(x) per lane, Cephes' single-precision polynomial (about 1 ulp against std::exp).
// exp(-inf) = 0, NaN stays NaN; below ln(2^-126) it returns 0 where std::exp would return a
// denormal (an absolute difference under 1.2e-38).
template <typename VF, typename VU>
JAX_MLA_INLINE VF ExpN(VF x) {
  const VF lo = SplatN<VF>(-87.33654475f), hi = SplatN<VF>(88.37626266f);
  VF xc = x < lo ? lo : x;  // NaN compares false: it passes through
  xc = xc > hi ? hi : xc;
  const VF magic = SplatN<VF>(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const VF shifted = xc * 1.44269504088896341f + magic;
  const VU n = BitsOf<VU>(shifted) - BitsOf<VU>(magic);  // round(x / ln 2), two's complement
  const VF fn = shifted - magic;
  VF r = xc - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  VF p = SplatN<VF>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  VF y = p * FloatsOf<VF>((n + 127u) << 23);
  y = x < lo ? SplatN<VF>(0.0f) : y;
  y = x > hi ? SplatN<VF>(std::numeric_limits<float>::infinity()) : y;
  return y;
}

JAX_MLA_INLINE V8 Exp(V8 x) { return ExpN<V8, U8>(x); }

// 16 lanes, for the AVX-512 kernels (only ever inlined into functions compiled for them).
typedef float V16 __attribute__((vector_size(64), aligned(4), may_alias));
typedef std::uint32_t U16 __attribute__((vector_size(64), aligned(4), may_alias));

// e4m3fn bytes (already widened to u32 lanes) to floats, exactly DecodeE4m3fn's values (NaN
// for S.1111.111, as a positive quiet NaN), times the tile scale. VF/VU: float and u32 vectors
// of one width.
template <typename VF, typename VU>
JAX_MLA_INLINE VF E4m3TimesN(VU b, float scale) {
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

// 8 bytes widened to u32 lanes. Through u16: GCC 12 turns a direct u8 -> u32 conversion into
// scalar byte loads, but each of these two steps into one widening instruction.
JAX_MLA_INLINE U8 Widen8(const std::uint8_t* src) {
  typedef std::uint8_t Bytes __attribute__((vector_size(8)));
  Bytes b;
  std::memcpy(&b, src, sizeof(b));
  return __builtin_convertvector(__builtin_convertvector(b, H8), U8);
}

JAX_MLA_INLINE V8 E4m3Times(const std::uint8_t* src, float scale) {
  return E4m3TimesN<V8, U8>(Widen8(src), scale);
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
template <typename VU, typename VF>
JAX_MLA_INLINE VU RoundToBf16Bits(VF v) {
  const VU bits = BitsOf<VU>(v);
  return (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
}

// The online-softmax step of one tile, one vector of query rows at a time (VF/VU: float and u32
// vectors of one width, 8 or 16 lanes). scores [tokens][stride] holds the scaled scores of this
// tile (stride = rows padded to a multiple of the width; columns past the block's rows are
// computed and ignored). For each row:
//   new_max = max(max, max_j s_j) (a NaN score is skipped here and reaches sum and acc below),
//   correction = exp(max - new_max) (0 while nothing was seen),
//   p_j = exp(s_j - new_max), sum = sum * correction + sum_j p_j,
//   weight_sum = weight_sum * correction + sum_j w_j, w_j the weight PV uses:
// kBf16Weights false: w_j = p_j, written over the scores. true: w_j = bf16(p_j), written as
// pairs (w_2i | w_2i+1 << 16) to pairs[i][stride], with w = 0 past the last token.
template <bool kBf16Weights, typename VF, typename VU>
JAX_MLA_INLINE void SoftmaxStepN(float* scores, int stride, int rows, int tokens, float* max,
                                 float* sum, float* weight_sum, float* correction,
                                 std::uint32_t* pairs) {
  constexpr int kLanes = sizeof(VF) / sizeof(float);
  const VF neg_inf = SplatN<VF>(-std::numeric_limits<float>::infinity());
  const VF zero = SplatN<VF>(0.0f);
  for (int r = 0; r < rows; r += kLanes) {
    const VF old_max = LoadN<VF>(max + r);
    VF tile_max = neg_inf;
    for (int j = 0; j < tokens; ++j) {
      const VF s = LoadN<VF>(scores + static_cast<std::size_t>(j) * stride + r);
      tile_max = tile_max < s ? s : tile_max;
    }
    const VF new_max = old_max < tile_max ? tile_max : old_max;
    const VF c = old_max == neg_inf ? zero : ExpN<VF, VU>(old_max - new_max);
    VF tile_sum = zero, tile_weights = zero;
    if constexpr (kBf16Weights) {
      for (int j = 0; j < tokens; j += 2) {
        const VF p0 = ExpN<VF, VU>(LoadN<VF>(scores + static_cast<std::size_t>(j) * stride + r) -
                                   new_max);
        VF p1 = zero;
        if (j + 1 < tokens) {
          p1 = ExpN<VF, VU>(LoadN<VF>(scores + static_cast<std::size_t>(j + 1) * stride + r) -
                            new_max);
        }
        const VU w0 = RoundToBf16Bits<VU>(p0), w1 = RoundToBf16Bits<VU>(p1);
        tile_sum += p0;
        tile_sum += p1;
        tile_weights += FloatsOf<VF>(w0 << 16);
        tile_weights += FloatsOf<VF>(w1 << 16);
        const VU pair = w0 | (w1 << 16);
        std::memcpy(pairs + static_cast<std::size_t>(j / 2) * stride + r, &pair, sizeof(pair));
      }
    } else {
      for (int j = 0; j < tokens; ++j) {
        float* row = scores + static_cast<std::size_t>(j) * stride + r;
        const VF p = ExpN<VF, VU>(LoadN<VF>(row) - new_max);
        tile_sum += p;
        StoreN(row, p);
      }
      tile_weights = tile_sum;
    }
    StoreN(sum + r, LoadN<VF>(sum + r) * c + tile_sum);
    StoreN(weight_sum + r, LoadN<VF>(weight_sum + r) * c + tile_weights);
    StoreN(max + r, new_max);
    StoreN(correction + r, c);
  }
}

}  // namespace
}  // namespace jax_mla::host

#endif  // JAX_MLA_HOST_TILE_MATH_H_
