// The attention arithmetic both kernels' workgroups do, on the host: a block of up to 128 query
// rows (every (token, head) row of one sequence) attends to a run of KV rows, one tile of
// TileTokens() tokens at a time, with an online softmax. What the result means (a split's
// partial, a persistent piece, a final row with the sink) is each executor's business; this only
// leaves the running state.
//
// Two kernel families, picked once per process from the CPU (ActiveKernels()):
//   "avx512-bf16": QK and PV as bf16 dot products with f32 accumulation (VDPBF16PS), where the
//     CPU has AVX512-BF16. Q and K are exact in bf16 (fp8 values times a power of two, bf16
//     RoPE), so the scores are as exact as in f32; the PV weights are the softmax
//     probabilities rounded to bf16 (relative error <= 2^-9 each, as the GPU kernels' P), and
//     the output is normalised by the sum of those same rounded weights.
//   "fp32": f32 FMAs throughout (compiled for x86-64-v3, AVX2 + FMA, and for the baseline, picked
//     by the CPU at load time; a Clang build has the baseline only, and no bf16 family).
// JAX_MLA_HOST_KERNELS=fp32 in the environment forces the second (read whenever an executor
// call sets up its threads, so tests and benchmarks can switch between calls).
// Results never depend on threads, on calls, or on which other rows share a block.
#ifndef JAX_MLA_HOST_ATTENTION_TILE_H_
#define JAX_MLA_HOST_ATTENTION_TILE_H_

#include <cstdint>

#include "host/row_format.h"

namespace jax_mla::host {

inline constexpr int kMaxQueryRows = 128;  // query rows of one block

enum class TileKernels { kFp32, kAvx512Bf16 };

// The family a block set up now uses (see above).
TileKernels ActiveKernels();
const char* KernelsName(TileKernels kernels);

// KV tokens per tile: 96 where the per-core L2 holds a 128-row block's working set at that tile
// (about 0.8 MiB: Q, the accumulator, the dequantized tile, its scores), else 48.
int TileTokens();

// Per-thread buffers and the softmax state of one block of query rows; reused across blocks.
// After AttendKvRows, for each row r < num_rows, over the scaled scores s_n seen so far:
//   max[r] = max_n s_n, sum[r] = sum_n exp(s_n - max[r]) (f32),
//   weight_sum[r] = sum_n w_n, acc[r * 512 + d] = sum_n w_n * v_n[d] (not normalised),
// where w_n is the weight PV used: exp(s_n - max[r]) itself with the fp32 kernels, that value
// rounded to bf16 with the bf16 kernels. So the row's output is acc / weight_sum and its
// natural-log denominator max + log(sum).
class QueryBlock {
 public:
  QueryBlock();
  ~QueryBlock();
  QueryBlock(const QueryBlock&) = delete;
  QueryBlock& operator=(const QueryBlock&) = delete;

  int num_rows = 0;
  float max[kMaxQueryRows];
  float sum[kMaxQueryRows];
  float weight_sum[kMaxQueryRows];
  float correction[kMaxQueryRows];

  const float* Acc(int row) const { return acc_ + static_cast<std::size_t>(row) * kHeadDim; }
  float* Acc(int row) { return acc_ + static_cast<std::size_t>(row) * kHeadDim; }

  // Kernel scratch (layouts are the kernels' own; see attention_tile.cc and tile_bf16.cc).
  TileKernels kernels;
  int tile_tokens;
  int padded_rows = 0;        // num_rows rounded up to 16
  float* acc_;                // [kMaxQueryRows][512]
  bool acc_empty_ = true;     // acc_ not yet written since the softmax restarted (read as 0)
  const std::uint8_t* loaded_q_ = nullptr;  // what LoadQueryRowsOnce last loaded, and when
  int loaded_rows_ = 0;
  std::uint64_t loaded_call_ = 0;
  void* q_;                   // Q in the kernels' layout
  void* k_;                   // the dequantized KV tile (and its PV layout)
  float* scores_;             // [tile][padded_rows]
  std::uint32_t* pairs_;      // bf16 weight pairs [tile / 2][padded_rows]

 private:
  void* storage_;
};

// Where KV rows live: kv [rows, 512] packed, kv_rope [rows, 64] bf16.
struct KvRows {
  const std::uint8_t* kv;
  const std::uint16_t* kv_rope;
};

// KV rows a call may ask the caches for while it works (the first tile it will attend to:
// no earlier tile prefetched them).
struct KvPrefetch {
  KvRows kv{nullptr, nullptr};
  const std::int32_t* ids = nullptr;
  std::int64_t count = 0;
};

// Dequantizes num_rows (1..128) consecutive packed query rows (q [num_rows, 512], q_rope
// [num_rows, 64]) into the block and starts an empty softmax (max -inf, sums 0, acc 0);
// meanwhile prefetches up to one tile of `prefetch` (indices already bounds-checked).
void LoadQueryRows(const std::uint8_t* q, const std::uint16_t* q_rope, int num_rows,
                   QueryBlock& block, const KvPrefetch& prefetch = {});

// A number no other executor call gets: a block keeps the Q it loaded for the call that loaded
// it, never for another (the buffer may hold other values by then).
std::uint64_t NewCallId();

// LoadQueryRows, except that a block already holding these rows, loaded during call `call_id`,
// keeps them and only restarts its softmax (pieces of one row, one after the other).
void LoadQueryRowsOnce(const std::uint8_t* q, const std::uint16_t* q_rope, int num_rows,
                       std::uint64_t call_id, QueryBlock& block, const KvPrefetch& prefetch = {});

// Attends the block to KV rows kv_ids[0..num_tokens) (indices already bounds-checked), in tiles
// starting at kv_ids[0], each KV row dequantized once per block; scores are q.k * scale.
void AttendKvRows(const KvRows& kv, const std::int32_t* kv_ids, std::int64_t num_tokens,
                  float softmax_scale, QueryBlock& block);

}  // namespace jax_mla::host

#endif  // JAX_MLA_HOST_ATTENTION_TILE_H_
