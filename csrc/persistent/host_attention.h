// The arithmetic of one workgroup of the persistent kernel on the host: attention of 64 query
// heads of one row over a run of its KV entries (a "piece"), and the merge of a row's pieces with
// the sink. fp32 throughout, like the kernel; the merge's scalars in double so that large finite
// sinks stay finite.
#ifndef JAX_MLA_PERSISTENT_HOST_ATTENTION_H_
#define JAX_MLA_PERSISTENT_HOST_ATTENTION_H_

#include <cstdint>
#include <vector>

namespace jax_mla::host {

inline constexpr int kHeadDim = 512;      // 448 fp8 NoPE + 64 bf16 RoPE
inline constexpr int kNopeDim = 448;
inline constexpr int kRopeDim = 64;
inline constexpr int kRowBytes = 512;     // packed row; bytes 462..511 are padding, never read
inline constexpr int kTileTokens = 32;    // the kernel's KV tile
inline constexpr int kHeadsPerWorkgroup = 64;

// Dequantizes one packed row (448 fp8 bytes with 7 e8m0 scales at bytes 448, 450, ..., 460) plus
// its 64 bf16 RoPE values into 512 floats.
void DequantizeRow(const std::uint8_t* packed, const std::uint16_t* rope, float* out);

// Per-thread buffers, reused across pieces.
struct PieceScratch {
  std::vector<float> q = std::vector<float>(kHeadsPerWorkgroup * kHeadDim);
  std::vector<float> k = std::vector<float>(kTileTokens * kHeadDim);     // [token][dim]
  std::vector<float> scores = std::vector<float>(kHeadsPerWorkgroup * kTileTokens);
  std::vector<float> acc = std::vector<float>(kHeadsPerWorkgroup * kHeadDim);
  std::vector<double> lse2 = std::vector<double>(kHeadsPerWorkgroup);
};

// Where one piece reads from. q/q_rope point at the first of the 64 heads; kv_ids are the
// piece's kv row indices (already bounds-checked).
struct PieceInputs {
  const std::uint8_t* q;        // [64, 512] packed
  const std::uint16_t* q_rope;  // [64, 64] bf16
  const std::uint8_t* kv;       // [rows, 512] packed
  const std::uint16_t* kv_rope; // [rows, 64] bf16
  const std::int32_t* kv_ids;
  std::int64_t num_tokens;      // >= 1
  float softmax_scale;
};

// Leaves in scratch.acc the normalised partial output [64, 512] (sum_n p_n v_n / sum_n p_n) and
// in scratch.lse2 the partial log2 denominator log2(sum_n exp(s_n)), no sink.
void AttendPiece(const PieceInputs& in, PieceScratch& scratch);

// Merges pieces of one head (partial outputs o_i[512], log2 lse_i) with the sink (natural log,
// -inf for none, +inf gives out 0) into out (bf16 bits) and, when lse is non-null, the natural
// log of the full denominator.
void MergeHead(const float* const* partials, const double* lse2, int num_pieces, float sink,
               std::uint16_t* out, float* lse);

}  // namespace jax_mla::host

#endif  // JAX_MLA_PERSISTENT_HOST_ATTENTION_H_
