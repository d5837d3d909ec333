// The persistent kernel's own arithmetic on top of the shared tile core (host/attention_tile.h):
// a piece (64 query heads of one row over a run of its KV entries) normalised with its log2
// denominator, and the merge of a row's pieces with the sink. The merge's scalars are in double
// so that large finite sinks stay finite.
#ifndef JAX_MLA_PERSISTENT_HOST_ATTENTION_H_
#define JAX_MLA_PERSISTENT_HOST_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "host/attention_tile.h"

namespace jax_mla::host {

inline constexpr int kHeadsPerWorkgroup = 64;  // a workgroup: half of a row's 128 heads

// Per-thread buffers, reused across pieces.
struct PieceScratch {
  QueryBlock block;
  std::vector<double> lse2 = std::vector<double>(kMaxQueryRows);
};

// Where one piece reads from. q/q_rope point at the first of num_heads heads; kv_ids are the
// piece's kv row indices (already bounds-checked).
struct PieceInputs {
  const std::uint8_t* q;        // [num_heads, 512] packed
  const std::uint16_t* q_rope;  // [num_heads, 64] bf16
  int num_heads;                // 1..128
  const std::uint8_t* kv;       // [rows, 512] packed
  const std::uint16_t* kv_rope; // [rows, 64] bf16
  const std::int32_t* kv_ids;
  std::int64_t num_tokens;      // >= 1
  float softmax_scale;
  std::uint64_t call_id;        // host::NewCallId() of this executor call (Q reuse)
};

// Leaves in scratch.block.acc the normalised partial output [num_heads, 512] (sum_n w_n v_n /
// sum_n w_n, w_n the weights PV used) and in scratch.lse2 the partial log2 denominator
// log2(sum_n exp(s_n)), no sink.
void AttendPiece(const PieceInputs& in, PieceScratch& scratch);

// Merges pieces of one head (partial outputs o_i[512], log2 lse_i) with the sink (natural log,
// -inf for none, +inf gives out 0) into out (bf16 bits) and, when lse is non-null, the natural
// log of the full denominator. A NaN lse_i (a NaN score) makes out and lse NaN, +inf sink or not.
void MergeHead(const float* const* partials, const double* lse2, int num_pieces, float sink,
               std::uint16_t* out, float* lse);

}  // namespace jax_mla::host

#endif  // JAX_MLA_PERSISTENT_HOST_ATTENTION_H_
