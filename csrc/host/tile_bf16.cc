// The bf16 kernel family: QK and PV as VDPBF16PS dot products (pairs of bf16 products added
// to f32 lanes), for CPUs with AVX512-BF16. Every function that runs it carries the target
// attribute; the shared pieces (tile_math.h) are forced inline into them.
//
// Layouts (u32 = a pair of bf16, low half first):
//   q_      Q as pairs along the dims: qp[dim pair][padded_rows] (256 x rows u32)
//   k_      the tile's rows as bf16, kb[token][512], then V as pairs along the tokens:
//           vp[token pair][512] u32 = (V[2i][d], V[2i+1][d])
//   scores_ [token][padded_rows] f32;  pairs_ [token pair][padded_rows] u32 bf16 weights
#include "host/tile_kernels.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>

#include "host/tile_math.h"

// GCC only, like the fp32 kernels' clones: Clang refuses the 16-lane vector-extension helpers of
// tile_math.h inside target-attributed functions ("changes the ABI"), so a Clang build runs the
// fp32 kernels.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define JAX_MLA_BF16_KERNELS 1
#include <immintrin.h>
#endif

namespace jax_mla::host::bf16 {

#if JAX_MLA_BF16_KERNELS

#define JAX_MLA_BF16_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")))
#define JAX_MLA_BF16_INLINE JAX_MLA_INLINE JAX_MLA_BF16_TARGET

namespace {

constexpr int kDimPairs = kHeadDim / 2;

JAX_MLA_BF16_INLINE __m512bh AsBh(__m512i v) { return (__m512bh)v; }
JAX_MLA_BF16_INLINE __m512bh LoadBh(const std::uint32_t* p) {
  return AsBh(_mm512_loadu_si512(p));
}
JAX_MLA_BF16_INLINE __m512bh Broadcast(std::uint32_t pair) {
  return AsBh(_mm512_set1_epi32(static_cast<int>(pair)));
}

// scores[j][r] = scale * sum_d kb[j][d] * q[r][d] for kMj tokens x 16 * kNr rows: kMj * kNr
// accumulators along the rows, one broadcast K pair per token and dim pair.
template <int kMj, int kNr>
JAX_MLA_BF16_INLINE void Scores(const std::uint32_t* qp, int stride, const std::uint32_t* kb,
                                float scale, float* scores) {
  __m512 a[kMj][kNr];
#pragma GCC unroll 16
  for (int i = 0; i < kMj; ++i) {
#pragma GCC unroll 4
    for (int c = 0; c < kNr; ++c) a[i][c] = _mm512_setzero_ps();
  }
  for (int dp = 0; dp < kDimPairs; ++dp) {
    __m512bh q[kNr];
#pragma GCC unroll 4
    for (int c = 0; c < kNr; ++c) q[c] = LoadBh(qp + static_cast<std::size_t>(dp) * stride + 16 * c);
#pragma GCC unroll 16
    for (int i = 0; i < kMj; ++i) {
      const __m512bh k = Broadcast(kb[static_cast<std::size_t>(i) * kDimPairs + dp]);
#pragma GCC unroll 4
      for (int c = 0; c < kNr; ++c) a[i][c] = _mm512_dpbf16_ps(a[i][c], q[c], k);
    }
  }
  const __m512 s = _mm512_set1_ps(scale);
#pragma GCC unroll 16
  for (int i = 0; i < kMj; ++i) {
#pragma GCC unroll 4
    for (int c = 0; c < kNr; ++c) {
      _mm512_storeu_ps(scores + static_cast<std::size_t>(i) * stride + 16 * c,
                       _mm512_mul_ps(a[i][c], s));
    }
  }
}

// acc[r][d] = acc[r][d] * correction[r] + sum_i w[r][2i] v[2i][d] + w[r][2i+1] v[2i+1][d] for
// kMr rows x 64 dims, the token pairs in order (acc read as 0 when fresh).
template <int kMr>
JAX_MLA_BF16_INLINE void Accumulate(const std::uint32_t* pairs, int stride, const float* correction,
                                    const std::uint32_t* vp, int num_pairs, float* acc,
                                    bool fresh) {
  __m512 a[kMr][4];
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i) {
    const __m512 c = _mm512_set1_ps(correction[i]);
#pragma GCC unroll 4
    for (int x = 0; x < 4; ++x) {
      a[i][x] = fresh ? _mm512_setzero_ps()
                      : _mm512_mul_ps(c, _mm512_loadu_ps(acc + static_cast<std::size_t>(i) *
                                                               kHeadDim + 16 * x));
    }
  }
  for (int jp = 0; jp < num_pairs; ++jp) {
    __m512bh v[4];
#pragma GCC unroll 4
    for (int x = 0; x < 4; ++x) v[x] = LoadBh(vp + static_cast<std::size_t>(jp) * kHeadDim + 16 * x);
    const std::uint32_t* w = pairs + static_cast<std::size_t>(jp) * stride;
#pragma GCC unroll 8
    for (int i = 0; i < kMr; ++i) {
      const __m512bh p = Broadcast(w[i]);
#pragma GCC unroll 4
      for (int x = 0; x < 4; ++x) a[i][x] = _mm512_dpbf16_ps(a[i][x], v[x], p);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 4
    for (int x = 0; x < 4; ++x) {
      _mm512_storeu_ps(acc + static_cast<std::size_t>(i) * kHeadDim + 16 * x, a[i][x]);
    }
  }
}

// The 128 e4m3fn magnitudes as bf16 bits (DecodeE4m3fn's values, exact: at most 4 significant
// bits; 0x7F a positive quiet NaN), in four registers of 32 for VPERMT2W.
struct E4m3Table {
  __m512i t[4];
};

JAX_MLA_BF16_INLINE E4m3Table LoadE4m3Table() {
  alignas(64) static const auto bits = [] {
    std::array<std::uint16_t, 128> t{};
    for (int mag = 0; mag < 128; ++mag) {
      const float v = DecodeE4m3fn(static_cast<std::uint8_t>(mag));
      std::uint32_t u;
      std::memcpy(&u, &v, sizeof(u));
      t[mag] = static_cast<std::uint16_t>(u >> 16);
    }
    return t;
  }();
  E4m3Table table;
  for (int i = 0; i < 4; ++i) table.t[i] = _mm512_loadu_si512(bits.data() + 32 * i);
  return table;
}

// One scale tile of 64 bytes, values e4m3 * 2^(scale_byte - 127), as the f32 path below gives
// them. Only for scale bytes in [10, 245]: there every nonzero product is a normal float (the
// magnitudes are 2^-9 .. 448), so scaling is an add to the exponent field, exact.
JAX_MLA_BF16_INLINE void DequantizeTileByTable(const std::uint8_t* src, int scale_byte,
                                               const E4m3Table& table, std::uint16_t* out) {
  // The exponent field's step is 1 << 7; a multiply, since shifting a negative int is undefined.
  const __m512i exponent = _mm512_set1_epi16(static_cast<std::int16_t>((scale_byte - 127) * 128));
  for (int i = 0; i < kScaleTileDim; i += 32) {
    const __m512i b = _mm512_cvtepu8_epi16(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    const __m512i lo = _mm512_permutex2var_epi16(table.t[0], b, table.t[1]);  // index bits 0-5
    const __m512i hi = _mm512_permutex2var_epi16(table.t[2], b, table.t[3]);
    __m512i v = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(b, _mm512_set1_epi16(0x40)), lo, hi);
    const __mmask32 nan = _mm512_cmpeq_epi16_mask(_mm512_or_si512(b, _mm512_set1_epi16(0x80)),
                                                  _mm512_set1_epi16(0xFF));
    const __mmask32 finite_nonzero =
        _kandn_mask32(nan, _mm512_test_epi16_mask(b, _mm512_set1_epi16(0x7F)));
    v = _mm512_mask_add_epi16(v, finite_nonzero, v, exponent);
    const __m512i sign = _mm512_and_si512(_mm512_slli_epi16(b, 8), _mm512_set1_epi16(-0x8000));
    v = _mm512_or_si512(v, _mm512_maskz_mov_epi16(~nan, sign));  // NaN stays positive
    _mm512_storeu_si512(out + i, v);
  }
}

// One packed row (and its bf16 RoPE) as 512 bf16 bit patterns. Exact: an e4m3 value times a
// power of two has 4 significant bits, so dropping the low 16 bits of its float loses nothing
// (float denormals below 2^-133 aside, which become 0). The RoPE bits are copied. Tiles with a
// scale in the table's range go through it (a third of the instructions); others through f32.
JAX_MLA_BF16_INLINE void DequantizeRowBf16(const std::uint8_t* packed, const std::uint16_t* rope,
                                           const E4m3Table& table, std::uint16_t* out) {
  for (int tile = 0; tile < kScaleTiles; ++tile) {
    const int scale_byte = packed[kFirstScaleByte + 2 * tile];
    if (scale_byte >= 10 && scale_byte <= 245) {
      DequantizeTileByTable(packed + kScaleTileDim * tile, scale_byte, table,
                            out + kScaleTileDim * tile);
      continue;
    }
    const float scale = ScaleOf(packed, tile);
    for (int i = 0; i < kScaleTileDim; i += 16) {
      const std::uint8_t* src = packed + kScaleTileDim * tile + i;
      const __m512i widened = _mm512_cvtepu8_epi32(_mm_loadu_si128(
          reinterpret_cast<const __m128i*>(src)));
      U16 lanes;
      std::memcpy(&lanes, &widened, sizeof(lanes));
      const V16 value = E4m3TimesN<V16, U16>(lanes, scale);
      __m512i bits;
      std::memcpy(&bits, &value, sizeof(bits));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + kScaleTileDim * tile + i),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(bits, 16)));
    }
  }
  std::memcpy(out + kNopeDim, rope, sizeof(std::uint16_t) * kRopeDim);
}

// vp[i][d] = (kb[2i][d], kb[2i+1][d]) for the first num_pairs token pairs.
JAX_MLA_BF16_INLINE void InterleaveTokenPairs(const std::uint16_t* kb, int num_pairs,
                                              std::uint32_t* vp) {
  alignas(64) std::uint16_t lo_idx[32], hi_idx[32];
  for (int e = 0; e < 32; ++e) {
    lo_idx[e] = static_cast<std::uint16_t>((e & 1 ? 32 : 0) + e / 2);
    hi_idx[e] = static_cast<std::uint16_t>((e & 1 ? 32 : 0) + 16 + e / 2);
  }
  const __m512i lo = _mm512_load_si512(lo_idx), hi = _mm512_load_si512(hi_idx);
  for (int i = 0; i < num_pairs; ++i) {
    const std::uint16_t* r0 = kb + static_cast<std::size_t>(2 * i) * kHeadDim;
    const std::uint16_t* r1 = r0 + kHeadDim;
    std::uint32_t* out = vp + static_cast<std::size_t>(i) * kHeadDim;
    for (int d = 0; d < kHeadDim; d += 32) {
      const __m512i a = _mm512_loadu_si512(r0 + d), b = _mm512_loadu_si512(r1 + d);
      _mm512_storeu_si512(out + d, _mm512_permutex2var_epi16(a, lo, b));
      _mm512_storeu_si512(out + d + 16, _mm512_permutex2var_epi16(a, hi, b));
    }
  }
}

// r[k] = column k of the 16 x 16 block of u32 whose rows are r[0..15] (shuffles: 16 gathers
// of one lane per row cost several times more).
JAX_MLA_BF16_INLINE void Transpose16(__m512i r[16]) {
  __m512i t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
#pragma GCC unroll 2
  for (int h = 0; h < 16; h += 8) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      t[h + j] = _mm512_shuffle_i32x4(r[h + j], r[h + 4 + j], 0x88);
      t[h + 4 + j] = _mm512_shuffle_i32x4(r[h + j], r[h + 4 + j], 0xdd);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0xdd);
  }
}

template <int kNr>
JAX_MLA_BF16_INLINE void ScoreRows(const QueryBlock& b, const std::uint32_t* kb, int n,
                                   float scale, int r0, RowPrefetch& prefetch) {
  constexpr int kMj = kNr == 4 ? 6 : kNr == 2 ? 12 : 16;  // 24, 24, 16 of 32 registers
  const int stride = b.padded_rows;
  const std::uint32_t* qp = static_cast<const std::uint32_t*>(b.q_) + r0;
  for (int j0 = 0; j0 < n; j0 += kMj) {
    Scores<kMj, kNr>(qp, stride, kb + static_cast<std::size_t>(j0) * kDimPairs, scale,
                     b.scores_ + static_cast<std::size_t>(j0) * stride + r0);
    prefetch.Next(2);
  }
}

}  // namespace

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")))
void LoadQuery(const std::uint8_t* q, const std::uint16_t* q_rope, QueryBlock& b,
               const KvRows& kv, const std::int32_t* prefetch_ids, int prefetch_count) {
  std::uint32_t* qp = static_cast<std::uint32_t*>(b.q_);
  const int stride = b.padded_rows;
  RowPrefetch prefetch{kv.kv, kv.kv_rope, prefetch_ids, prefetch_count};
  const int per_group = (prefetch_count + stride / 16 - 1) / (stride / 16);
  // 16 rows at a time: dequantized row-major, then transposed 16 x 16 pairs at a time.
  alignas(64) std::uint32_t rows[16][kDimPairs];
  const E4m3Table table = LoadE4m3Table();
  for (int r0 = 0; r0 < stride; r0 += 16) {
    prefetch.Next(per_group);
    for (int i = 0; i < 16; ++i) {
      const int r = r0 + i;
      if (r < b.num_rows) {
        DequantizeRowBf16(q + static_cast<std::size_t>(kRowBytes) * r,
                          q_rope + static_cast<std::size_t>(kRopeDim) * r, table,
                          reinterpret_cast<std::uint16_t*>(rows[i]));
      } else {
        std::memset(rows[i], 0, sizeof(rows[i]));
      }
    }
    for (int dp0 = 0; dp0 < kDimPairs; dp0 += 16) {
      __m512i block[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) block[i] = _mm512_load_si512(&rows[i][dp0]);
      Transpose16(block);
#pragma GCC unroll 16
      for (int k = 0; k < 16; ++k) {
        _mm512_storeu_si512(qp + static_cast<std::size_t>(dp0 + k) * stride + r0, block[k]);
      }
    }
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")))
void AttendTile(const KvRows& kv, const std::int32_t* kv_ids, int n, float scale,
                QueryBlock& b, const std::int32_t* next_ids, int next_n) {
  constexpr int kMr = 6;
  RowPrefetch prefetch{kv.kv, kv.kv_rope, next_ids, next_n};
  std::uint16_t* kb = static_cast<std::uint16_t*>(b.k_);
  const E4m3Table table = LoadE4m3Table();
  const std::size_t tile_rows = static_cast<std::size_t>(b.tile_tokens) + 16;
  std::uint32_t* vp = reinterpret_cast<std::uint32_t*>(kb + tile_rows * kHeadDim);
  for (int j = 0; j < n; ++j) {
    const std::int64_t row = kv_ids[j];
    DequantizeRowBf16(kv.kv + static_cast<std::size_t>(row) * kRowBytes,
                      kv.kv_rope + static_cast<std::size_t>(row) * kRopeDim, table,
                      kb + static_cast<std::size_t>(kHeadDim) * j);
  }
  // Up to 15 zero rows: the score kernels round n up to their token count, PV to a pair.
  std::memset(kb + static_cast<std::size_t>(kHeadDim) * n, 0, sizeof(std::uint16_t) * kHeadDim * 15);
  const int num_pairs = (n + 1) / 2;
  InterleaveTokenPairs(kb, num_pairs, vp);

  const int stride = b.padded_rows;
  const std::uint32_t* kb32 = reinterpret_cast<const std::uint32_t*>(kb);
  int r0 = 0;
  for (; r0 + 64 <= stride; r0 += 64) ScoreRows<4>(b, kb32, n, scale, r0, prefetch);
  for (; r0 + 32 <= stride; r0 += 32) ScoreRows<2>(b, kb32, n, scale, r0, prefetch);
  for (; r0 < stride; r0 += 16) ScoreRows<1>(b, kb32, n, scale, r0, prefetch);

  SoftmaxStepN<true, V16, U16>(b.scores_, stride, stride, n, b.max, b.sum, b.weight_sum,
                               b.correction, b.pairs_);
  const bool fresh = b.acc_empty_;
  b.acc_empty_ = false;
  for (int d0 = 0; d0 < kHeadDim; d0 += 64) {
    prefetch.Next(12);
    for (int i0 = 0; i0 < b.num_rows; i0 += kMr) {
      const std::uint32_t* w = b.pairs_ + i0;
      const float* c = b.correction + i0;
      float* acc = b.Acc(i0) + d0;
      switch (std::min(kMr, b.num_rows - i0)) {
        case 6: Accumulate<6>(w, stride, c, vp + d0, num_pairs, acc, fresh); break;
        case 5: Accumulate<5>(w, stride, c, vp + d0, num_pairs, acc, fresh); break;
        case 4: Accumulate<4>(w, stride, c, vp + d0, num_pairs, acc, fresh); break;
        case 3: Accumulate<3>(w, stride, c, vp + d0, num_pairs, acc, fresh); break;
        case 2: Accumulate<2>(w, stride, c, vp + d0, num_pairs, acc, fresh); break;
        default: Accumulate<1>(w, stride, c, vp + d0, num_pairs, acc, fresh); break;
      }
    }
  }
}

bool Supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}

#else  // not x86-64 GCC: the fp32 kernels serve

bool Supported() { return false; }
void LoadQuery(const std::uint8_t*, const std::uint16_t*, QueryBlock&, const KvRows&,
               const std::int32_t*, int) {}
void AttendTile(const KvRows&, const std::int32_t*, int, float, QueryBlock&, const std::int32_t*,
                int) {}

#endif

}  // namespace jax_mla::host::bf16
