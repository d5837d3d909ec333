#include "persistent/host_attention.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "host/bf16.h"

namespace jax_mla::host {
namespace {

constexpr double kLog2e = 1.4426950408889634;
constexpr double kLn2 = 0.6931471805599453;

}  // namespace

void AttendPiece(const PieceInputs& in, PieceScratch& s) {
  LoadQueryRowsOnce(in.q, in.q_rope, in.num_heads, in.call_id, s.block);
  AttendKvRows(KvRows{in.kv, in.kv_rope}, in.kv_ids, in.num_tokens, in.softmax_scale, s.block);
  for (int h = 0; h < in.num_heads; ++h) {
    float* acc = s.block.Acc(h);
    const float inv = 1.0f / s.block.weight_sum[h];
    for (int d = 0; d < kHeadDim; ++d) acc[d] *= inv;
    s.lse2[h] = static_cast<double>(s.block.max[h]) * kLog2e +
                std::log2(static_cast<double>(s.block.sum[h]));
  }
}

void MergeHead(const float* const* partials, const double* lse2, int num_pieces, float sink,
               std::uint16_t* out, float* lse) {
  bool has_nan = false;
  for (int i = 0; i < num_pieces; ++i) has_nan |= std::isnan(lse2[i]);
  // A NaN score (a NaN in a used row or in the query) makes the head NaN whatever the sink, as
  // on the split path (docs/contracts.md); otherwise a +inf sink takes all the weight.
  if (!has_nan && sink == std::numeric_limits<float>::infinity()) {
    for (int d = 0; d < kHeadDim; ++d) out[d] = 0;
    if (lse) *lse = sink;
    return;
  }
  const double sink2 = static_cast<double>(sink) * kLog2e;  // -inf stays -inf
  double top = sink2;
  for (int i = 0; i < num_pieces; ++i) top = std::max(top, lse2[i]);
  if (has_nan) top = std::numeric_limits<double>::quiet_NaN();  // keep a NaN visible
  double weights[2 * 1024 + 1];
  double denominator = sink2 == -std::numeric_limits<double>::infinity() ? 0.0
                                                                         : std::exp2(sink2 - top);
  for (int i = 0; i < num_pieces; ++i) {
    weights[i] = std::exp2(lse2[i] - top);
    denominator += weights[i];
  }
  // Pieces outer, dims inner: each piece's 512 values are read once, in order (the sums over
  // the pieces keep their order for every dim).
  double sum[kHeadDim] = {};
  for (int i = 0; i < num_pieces; ++i) {
    const double w = weights[i];
    const float* partial = partials[i];
    for (int d = 0; d < kHeadDim; ++d) sum[d] += w * partial[d];
  }
  for (int d = 0; d < kHeadDim; ++d) out[d] = FloatToBf16(static_cast<float>(sum[d] / denominator));
  if (lse) *lse = static_cast<float>((top + std::log2(denominator)) * kLn2);
}

}  // namespace jax_mla::host
