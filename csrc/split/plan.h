// The nm kernel's launch plan: a pure function from a problem (device addresses and sizes) to
// the kernel, its 336 kernarg bytes and its grid. The HIP launcher and the host executor both
// consume this plan, so a slot or grid mistake shows up on the CPU as it would on the GPU.
#ifndef JAX_MLA_SPLIT_PLAN_H_
#define JAX_MLA_SPLIT_PLAN_H_

#include <cstdint>

#include "common/launch_plan.h"
#include "common/status.h"

namespace jax_mla {

// Device (or host, for the host executor) addresses of every buffer, plus the sizes that shape
// the launch. `out` is the bf16 output when num_kv_splits == 1 and the fp32 partials otherwise;
// partial_lse and valid_split_count are only used when num_kv_splits > 1.
struct SplitProblem {
  std::uint64_t out = 0;
  std::uint64_t partial_lse = 0;
  std::uint64_t valid_split_count = 0;
  std::uint64_t q = 0;
  std::uint64_t q_rope = 0;
  std::uint64_t kv = 0;
  std::uint64_t kv_rope = 0;
  std::uint64_t kv_indptr = 0;
  std::uint64_t kv_indices = 0;
  std::uint64_t qo_indptr = 0;
  std::uint64_t split_indptr = 0;
  std::uint64_t sink = 0;
  std::int64_t num_seqs = 0;
  std::int64_t num_heads = 0;       // = gqa (one KV head)
  std::int64_t tokens_per_seq = 0;  // = q_seq_len (msq)
  std::int64_t num_kv_splits = 0;   // S
};

// The kernel's query-row tile: a workgroup covers sub_q (token, head) rows of one sequence.
inline constexpr std::int64_t kSplitMaxSubQ = 64;
// The kernel's KV tile, in tokens; also the unit of the host executor's split rule.
inline constexpr std::int64_t kSplitKvTile = 32;

// True for the (gqa, tokens_per_seq) pairs the one nm binary serves:
// (16,1) (16,2) (16,4) (32,1) (64,1) (128,1).
bool SplitShapeSupported(std::int64_t num_heads, std::int64_t tokens_per_seq);
// "(16,1) (16,2) (16,4) (32,1) (64,1) (128,1)", for messages.
const char* SplitSupportedShapesText();

// Fills *plan. InvalidArgument (naming the values) for an unsupported (gqa, tokens_per_seq),
// num_kv_splits < 1, num_seqs < 1, or a missing address the kernel needs.
Status PlanSplit(const SplitProblem& problem, LaunchPlan* plan);

}  // namespace jax_mla

#endif  // JAX_MLA_SPLIT_PLAN_H_
