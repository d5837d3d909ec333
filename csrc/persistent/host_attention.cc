#include "persistent/host_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "persistent/host_numerics.h"

namespace jax_mla::host {
namespace {

constexpr double kLog2e = 1.4426950408889634;
constexpr double kLn2 = 0.6931471805599453;

}  // namespace

void DequantizeRow(const std::uint8_t* packed, const std::uint16_t* rope, float* out) {
  const ByteTables& t = Tables();
  for (int tile = 0; tile < kNopeDim / 64; ++tile) {
    const float scale = t.e8m0[packed[kNopeDim + 2 * tile]];  // each scale is stored twice
    for (int i = 0; i < 64; ++i) out[64 * tile + i] = t.e4m3fn[packed[64 * tile + i]] * scale;
  }
  for (int i = 0; i < kRopeDim; ++i) out[kNopeDim + i] = Bf16ToFloat(rope[i]);
}

// 8 floats; GCC/Clang vector extensions give SIMD in both clones below without intrinsics.
typedef float V8 __attribute__((vector_size(32), aligned(4), may_alias));

inline V8 Load(const float* p) { return *reinterpret_cast<const V8*>(p); }
inline void Store(float* p, V8 v) { *reinterpret_cast<V8*>(p) = v; }

// Compiled twice (AVX2+FMA and baseline x86-64), picked at load time by the CPU: the host
// backend's time is almost all in this function.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define JAX_MLA_HOT_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define JAX_MLA_HOT_CLONES
#endif

namespace {

// Sum of the 8 lanes, in a fixed order.
inline float LaneSum(V8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// scores[h][j] = q[h] . k[j] for 2 heads x 4 tokens at a time: 8 independent 8-lane partial sums
// over the 512 dims, then a fixed-order lane sum, so results do not depend on threads or calls.
// K is read row-major as dequantized (no transpose); each K load serves both heads.
JAX_MLA_HOT_CLONES void TileScores(const float* q, const float* k, int n, float* scores) {
  for (int h = 0; h < kHeadsPerWorkgroup; h += 2) {
    const float* qa = q + static_cast<std::size_t>(h) * kHeadDim;
    const float* qb = qa + kHeadDim;
    float* sa = scores + static_cast<std::size_t>(h) * kTileTokens;
    float* sb = sa + kTileTokens;
    for (int j = 0; j < n; j += 4) {
      // Rows past n are zero-filled by the caller, so 4 rows can always be read.
      const float* k0 = k + static_cast<std::size_t>(kHeadDim) * j;
      const float* k1 = k0 + kHeadDim;
      const float* k2 = k1 + kHeadDim;
      const float* k3 = k2 + kHeadDim;
      V8 a0 = {}, a1 = {}, a2 = {}, a3 = {}, b0 = {}, b1 = {}, b2 = {}, b3 = {};
      for (int d = 0; d < kHeadDim; d += 8) {
        const V8 x = Load(qa + d), y = Load(qb + d);
        const V8 r0 = Load(k0 + d), r1 = Load(k1 + d), r2 = Load(k2 + d), r3 = Load(k3 + d);
        a0 += x * r0; a1 += x * r1; a2 += x * r2; a3 += x * r3;
        b0 += y * r0; b1 += y * r1; b2 += y * r2; b3 += y * r3;
      }
      sa[j] = LaneSum(a0); sa[j + 1] = LaneSum(a1); sa[j + 2] = LaneSum(a2); sa[j + 3] = LaneSum(a3);
      sb[j] = LaneSum(b0); sb[j + 1] = LaneSum(b1); sb[j + 2] = LaneSum(b2); sb[j + 3] = LaneSum(b3);
    }
  }
}

// acc[h] = acc[h] * correction[h] + sum_j p[h][j] * k[j], two heads and 32 dims at a time; the
// dim block is the outer loop so its slice of K stays in L1 across all head pairs.
JAX_MLA_HOT_CLONES void TileAccumulate(const float* p, const float* correction, const float* k,
                                       int n, float* acc) {
  for (int d = 0; d < kHeadDim; d += 32) {
    for (int h = 0; h < kHeadsPerWorkgroup; h += 2) {
      float* acc_a = acc + static_cast<std::size_t>(h) * kHeadDim;
      float* acc_b = acc_a + kHeadDim;
      const float* pa = p + static_cast<std::size_t>(h) * kTileTokens;
      const float* pb = pa + kTileTokens;
      const float ca = correction[h], cb = correction[h + 1];
      V8 a0 = ca * Load(acc_a + d), a1 = ca * Load(acc_a + d + 8);
      V8 a2 = ca * Load(acc_a + d + 16), a3 = ca * Load(acc_a + d + 24);
      V8 b0 = cb * Load(acc_b + d), b1 = cb * Load(acc_b + d + 8);
      V8 b2 = cb * Load(acc_b + d + 16), b3 = cb * Load(acc_b + d + 24);
      for (int j = 0; j < n; ++j) {
        const float* kj = k + static_cast<std::size_t>(kHeadDim) * j + d;
        const V8 k0 = Load(kj), k1 = Load(kj + 8), k2 = Load(kj + 16), k3 = Load(kj + 24);
        const float x = pa[j], y = pb[j];
        a0 += x * k0; a1 += x * k1; a2 += x * k2; a3 += x * k3;
        b0 += y * k0; b1 += y * k1; b2 += y * k2; b3 += y * k3;
      }
      Store(acc_a + d, a0); Store(acc_a + d + 8, a1); Store(acc_a + d + 16, a2);
      Store(acc_a + d + 24, a3);
      Store(acc_b + d, b0); Store(acc_b + d + 8, b1); Store(acc_b + d + 16, b2);
      Store(acc_b + d + 24, b3);
    }
  }
}

}  // namespace

void AttendPiece(const PieceInputs& in, PieceScratch& s) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int h = 0; h < kHeadsPerWorkgroup; ++h) {
    DequantizeRow(in.q + std::size_t{kRowBytes} * h, in.q_rope + std::size_t{kRopeDim} * h,
                  s.q.data() + std::size_t{kHeadDim} * h);
  }
  std::fill(s.acc.begin(), s.acc.end(), 0.0f);
  float m[kHeadsPerWorkgroup], l[kHeadsPerWorkgroup], correction[kHeadsPerWorkgroup];
  std::fill(m, m + kHeadsPerWorkgroup, kNegInf);
  std::fill(l, l + kHeadsPerWorkgroup, 0.0f);

  for (std::int64_t t0 = 0; t0 < in.num_tokens; t0 += kTileTokens) {
    const int n = static_cast<int>(std::min<std::int64_t>(kTileTokens, in.num_tokens - t0));
    for (int j = 0; j < n; ++j) {
      const std::int64_t row = in.kv_ids[t0 + j];
      DequantizeRow(in.kv + static_cast<std::size_t>(row) * kRowBytes,
                    in.kv_rope + static_cast<std::size_t>(row) * kRopeDim,
                    s.k.data() + std::size_t{kHeadDim} * j);
    }
    // Zero rows up to the next multiple of 4, which the score loop reads (and masks below).
    for (int j = n; j < ((n + 3) & ~3); ++j) {
      std::fill_n(s.k.data() + std::size_t{kHeadDim} * j, kHeadDim, 0.0f);
    }
    TileScores(s.q.data(), s.k.data(), n, s.scores.data());
    // Online softmax per head; scores become the unnormalised probabilities in place.
    for (int h = 0; h < kHeadsPerWorkgroup; ++h) {
      float* row = s.scores.data() + std::size_t{kTileTokens} * h;
      float tile_max = kNegInf;
      for (int j = 0; j < n; ++j) {
        row[j] *= in.softmax_scale;
        tile_max = std::max(tile_max, row[j]);
      }
      const float m_new = std::max(m[h], tile_max);
      correction[h] = m[h] == kNegInf ? 0.0f : std::exp(m[h] - m_new);
      float tile_sum = 0.0f;
      for (int j = 0; j < n; ++j) {
        row[j] = std::exp(row[j] - m_new);
        tile_sum += row[j];
      }
      l[h] = l[h] * correction[h] + tile_sum;
      m[h] = m_new;
    }
    TileAccumulate(s.scores.data(), correction, s.k.data(), n, s.acc.data());
  }
  for (int h = 0; h < kHeadsPerWorkgroup; ++h) {
    float* acc = s.acc.data() + std::size_t{kHeadDim} * h;
    const float inv = 1.0f / l[h];
    for (int d = 0; d < kHeadDim; ++d) acc[d] *= inv;
    s.lse2[h] = static_cast<double>(m[h]) * kLog2e + std::log2(static_cast<double>(l[h]));
  }
}

void MergeHead(const float* const* partials, const double* lse2, int num_pieces, float sink,
               std::uint16_t* out, float* lse) {
  if (sink == std::numeric_limits<float>::infinity()) {  // the sink takes all the weight
    for (int d = 0; d < kHeadDim; ++d) out[d] = 0;
    if (lse) *lse = sink;
    return;
  }
  const double sink2 = static_cast<double>(sink) * kLog2e;  // -inf stays -inf
  double top = sink2;
  bool has_nan = false;
  for (int i = 0; i < num_pieces; ++i) {
    has_nan |= std::isnan(lse2[i]);
    top = std::max(top, lse2[i]);
  }
  if (has_nan) top = std::numeric_limits<double>::quiet_NaN();  // keep a NaN visible
  double weights[2 * 1024 + 1];
  double denominator = sink2 == -std::numeric_limits<double>::infinity() ? 0.0
                                                                         : std::exp2(sink2 - top);
  for (int i = 0; i < num_pieces; ++i) {
    weights[i] = std::exp2(lse2[i] - top);
    denominator += weights[i];
  }
  for (int d = 0; d < kHeadDim; ++d) {
    double sum = 0.0;
    for (int i = 0; i < num_pieces; ++i) sum += weights[i] * partials[i][d];
    out[d] = FloatToBf16(static_cast<float>(sum / denominator));
  }
  if (lse) *lse = static_cast<float>((top + std::log2(denominator)) * kLn2);
}

}  // namespace jax_mla::host
