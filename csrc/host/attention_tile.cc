#include "host/attention_tile.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

namespace jax_mla::host {
namespace {

// 8 floats; GCC/Clang vector extensions give SIMD in both clones below without intrinsics.
typedef float V8 __attribute__((vector_size(32), aligned(4), may_alias));

inline V8 Load(const float* p) { return *reinterpret_cast<const V8*>(p); }
inline void Store(float* p, V8 v) { *reinterpret_cast<V8*>(p) = v; }

// Compiled twice (AVX2+FMA and baseline x86-64), picked at load time by the CPU: the host
// backends' time is almost all in these two functions.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define JAX_MLA_HOT_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define JAX_MLA_HOT_CLONES
#endif

// Sum of the 8 lanes, in a fixed order.
inline float LaneSum(V8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// scores[r][j] = q[r] . k[j] for 2 rows x 4 tokens at a time: 8 independent 8-lane partial sums
// over the 512 dims, then a fixed-order lane sum, so results do not depend on threads or calls.
// K is read row-major as dequantized (no transpose); each K load serves both rows. rows is even
// and n rounds up to a multiple of 4 over zero-filled K rows.
JAX_MLA_HOT_CLONES void TileScores(const float* q, const float* k, int rows, int n,
                                   float* scores) {
  for (int h = 0; h < rows; h += 2) {
    const float* qa = q + static_cast<std::size_t>(h) * kHeadDim;
    const float* qb = qa + kHeadDim;
    float* sa = scores + static_cast<std::size_t>(h) * kTileTokens;
    float* sb = sa + kTileTokens;
    for (int j = 0; j < n; j += 4) {
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
      sa[j] = LaneSum(a0); sa[j + 1] = LaneSum(a1);
      sa[j + 2] = LaneSum(a2); sa[j + 3] = LaneSum(a3);
      sb[j] = LaneSum(b0); sb[j + 1] = LaneSum(b1);
      sb[j + 2] = LaneSum(b2); sb[j + 3] = LaneSum(b3);
    }
  }
}

// acc[r] = acc[r] * correction[r] + sum_j p[r][j] * k[j], two rows and 32 dims at a time; the
// dim block is the outer loop so its slice of K stays in L1 across all row pairs. rows is even.
JAX_MLA_HOT_CLONES void TileAccumulate(const float* p, const float* correction, const float* k,
                                       int rows, int n, float* acc) {
  for (int d = 0; d < kHeadDim; d += 32) {
    for (int h = 0; h < rows; h += 2) {
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

// The row-pair kernels above also compute an odd block's zero padding row.
int PaddedRows(int num_rows) { return (num_rows + 1) & ~1; }

}  // namespace

void LoadQueryRows(const std::uint8_t* q, const std::uint16_t* q_rope, int num_rows,
                   QueryBlock& block) {
  block.num_rows = num_rows;
  for (int r = 0; r < num_rows; ++r) {
    DequantizeRow(q + static_cast<std::size_t>(kRowBytes) * r,
                  q_rope + static_cast<std::size_t>(kRopeDim) * r,
                  block.q.data() + static_cast<std::size_t>(kHeadDim) * r);
  }
  const int rows = PaddedRows(num_rows);
  std::fill(block.q.begin() + static_cast<std::size_t>(kHeadDim) * num_rows,
            block.q.begin() + static_cast<std::size_t>(kHeadDim) * rows, 0.0f);
  std::fill_n(block.acc.begin(), static_cast<std::size_t>(kHeadDim) * rows, 0.0f);
  std::fill_n(block.max.begin(), rows, -std::numeric_limits<float>::infinity());
  std::fill_n(block.sum.begin(), rows, 0.0f);
}

void AttendKvRows(const KvRows& kv, const std::int32_t* kv_ids, std::int64_t num_tokens,
                  float softmax_scale, QueryBlock& b) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int rows = PaddedRows(b.num_rows);
  for (std::int64_t t0 = 0; t0 < num_tokens; t0 += kTileTokens) {
    const int n = static_cast<int>(std::min<std::int64_t>(kTileTokens, num_tokens - t0));
    for (int j = 0; j < n; ++j) {
      const std::int64_t row = kv_ids[t0 + j];
      DequantizeRow(kv.kv + static_cast<std::size_t>(row) * kRowBytes,
                    kv.kv_rope + static_cast<std::size_t>(row) * kRopeDim,
                    b.k.data() + std::size_t{kHeadDim} * j);
    }
    // Zero rows up to the next multiple of 4, which the score loop reads (and ignores below).
    for (int j = n; j < ((n + 3) & ~3); ++j) {
      std::fill_n(b.k.data() + std::size_t{kHeadDim} * j, kHeadDim, 0.0f);
    }
    TileScores(b.q.data(), b.k.data(), rows, n, b.scores.data());
    // Online softmax per row; scores become the unnormalised probabilities in place.
    for (int h = 0; h < rows; ++h) {
      float* row = b.scores.data() + std::size_t{kTileTokens} * h;
      float tile_max = kNegInf;
      for (int j = 0; j < n; ++j) {
        row[j] *= softmax_scale;
        tile_max = std::max(tile_max, row[j]);  // a NaN score is skipped here, kept below
      }
      const float new_max = std::max(b.max[h], tile_max);
      b.correction[h] = b.max[h] == kNegInf ? 0.0f : std::exp(b.max[h] - new_max);
      float tile_sum = 0.0f;
      for (int j = 0; j < n; ++j) {
        row[j] = std::exp(row[j] - new_max);
        tile_sum += row[j];
      }
      b.sum[h] = b.sum[h] * b.correction[h] + tile_sum;
      b.max[h] = new_max;
    }
    TileAccumulate(b.scores.data(), b.correction.data(), b.k.data(), rows, n, b.acc.data());
  }
}

}  // namespace jax_mla::host
