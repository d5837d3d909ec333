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

void AttendPiece(const PieceInputs& in, PieceScratch& s) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int h = 0; h < kHeadsPerWorkgroup; ++h) {
    DequantizeRow(in.q + std::size_t{kRowBytes} * h, in.q_rope + std::size_t{kRopeDim} * h,
                  s.q.data() + std::size_t{kHeadDim} * h);
  }
  std::fill(s.acc.begin(), s.acc.end(), 0.0f);
  float m[kHeadsPerWorkgroup], l[kHeadsPerWorkgroup];
  std::fill(m, m + kHeadsPerWorkgroup, kNegInf);
  std::fill(l, l + kHeadsPerWorkgroup, 0.0f);

  for (std::int64_t t0 = 0; t0 < in.num_tokens; t0 += kTileTokens) {
    const int n = static_cast<int>(std::min<std::int64_t>(kTileTokens, in.num_tokens - t0));
    for (int j = 0; j < n; ++j) {
      const std::int64_t row = in.kv_ids[t0 + j];
      float* k = s.k.data() + std::size_t{kHeadDim} * j;
      DequantizeRow(in.kv + static_cast<std::size_t>(row) * kRowBytes,
                    in.kv_rope + static_cast<std::size_t>(row) * kRopeDim, k);
    }
    // Transposed copy so the score loop runs over 32 contiguous tokens (vectorises without
    // reassociating any sum). Tokens past n are zero and masked below.
    for (int d = 0; d < kHeadDim; ++d) {
      float* kt = s.k_t.data() + std::size_t{kTileTokens} * d;
      for (int j = 0; j < n; ++j) kt[j] = s.k[std::size_t{kHeadDim} * j + d];
      for (int j = n; j < kTileTokens; ++j) kt[j] = 0.0f;
    }
    for (int h = 0; h < kHeadsPerWorkgroup; ++h) {
      const float* q = s.q.data() + std::size_t{kHeadDim} * h;
      float scores[kTileTokens] = {};
      for (int d = 0; d < kHeadDim; ++d) {
        const float qd = q[d];
        const float* kt = s.k_t.data() + std::size_t{kTileTokens} * d;
        for (int j = 0; j < kTileTokens; ++j) scores[j] += qd * kt[j];
      }
      float tile_max = kNegInf;
      for (int j = 0; j < n; ++j) {
        scores[j] *= in.softmax_scale;
        tile_max = std::max(tile_max, scores[j]);
      }
      const float m_new = std::max(m[h], tile_max);
      const float correction = m[h] == kNegInf ? 0.0f : std::exp(m[h] - m_new);
      float* acc = s.acc.data() + std::size_t{kHeadDim} * h;
      if (correction != 1.0f) {
        for (int d = 0; d < kHeadDim; ++d) acc[d] *= correction;
      }
      float tile_sum = 0.0f;
      for (int j = 0; j < n; ++j) {
        const float p = std::exp(scores[j] - m_new);
        tile_sum += p;
        const float* k = s.k.data() + std::size_t{kHeadDim} * j;
        for (int d = 0; d < kHeadDim; ++d) acc[d] += p * k[d];
      }
      l[h] = l[h] * correction + tile_sum;
      m[h] = m_new;
    }
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
