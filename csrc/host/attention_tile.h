// The attention arithmetic both kernels' workgroups do, on the host: a block of up to 64 query
// rows attends to a run of KV rows, one 32-token tile at a time, with an online softmax. fp32
// throughout, like the kernels. What the result means (a split's partial, a persistent piece, a
// final row with the sink) is each executor's business; this only leaves the running state.
#ifndef JAX_MLA_HOST_ATTENTION_TILE_H_
#define JAX_MLA_HOST_ATTENTION_TILE_H_

#include <cstdint>
#include <vector>

#include "host/row_format.h"

namespace jax_mla::host {

inline constexpr int kTileTokens = 32;    // the kernels' KV tile
inline constexpr int kMaxQueryRows = 64;  // query rows of one workgroup

// Per-thread buffers and the softmax state of one block of query rows; reused across blocks.
// After AttendKvRows, for each row r < num_rows, over the scaled scores s_n seen so far:
//   max[r] = max_n s_n, sum[r] = sum_n exp(s_n - max[r]),
//   acc[r * 512 + d] = sum_n exp(s_n - max[r]) * v_n[d] (not normalised).
struct QueryBlock {
  int num_rows = 0;
  std::vector<float> q = std::vector<float>(kMaxQueryRows * kHeadDim);
  std::vector<float> k = std::vector<float>(kTileTokens * kHeadDim);  // [token][dim]
  std::vector<float> scores = std::vector<float>(kMaxQueryRows * kTileTokens);
  std::vector<float> acc = std::vector<float>(kMaxQueryRows * kHeadDim);
  std::vector<float> max = std::vector<float>(kMaxQueryRows);
  std::vector<float> sum = std::vector<float>(kMaxQueryRows);
  std::vector<float> correction = std::vector<float>(kMaxQueryRows);

  const float* Acc(int row) const { return acc.data() + static_cast<std::size_t>(row) * kHeadDim; }
  float* Acc(int row) { return acc.data() + static_cast<std::size_t>(row) * kHeadDim; }
};

// Where KV rows live: kv [rows, 512] packed, kv_rope [rows, 64] bf16.
struct KvRows {
  const std::uint8_t* kv;
  const std::uint16_t* kv_rope;
};

// Dequantizes num_rows (1..64) consecutive packed query rows (q [num_rows, 512], q_rope
// [num_rows, 64]) into the block and starts an empty softmax (max -inf, sum 0, acc 0).
void LoadQueryRows(const std::uint8_t* q, const std::uint16_t* q_rope, int num_rows,
                   QueryBlock& block);

// Attends the block to KV rows kv_ids[0..num_tokens) (indices already bounds-checked), in tiles
// of 32 starting at kv_ids[0], each KV row dequantized once per block; scores are q.k * scale.
void AttendKvRows(const KvRows& kv, const std::int32_t* kv_ids, std::int64_t num_tokens,
                  float softmax_scale, QueryBlock& block);

}  // namespace jax_mla::host

#endif  // JAX_MLA_HOST_ATTENTION_TILE_H_
