#include "split/plan.h"

#include <cmath>
#include <string>

#include "split/kernargs.h"

namespace jax_mla {
namespace {

struct Pair {
  std::int64_t gqa, msq;
};
constexpr Pair kSupported[] = {{16, 1}, {16, 2}, {16, 4}, {32, 1}, {64, 1}, {128, 1}};

Status RequireAddress(std::uint64_t address, const char* name) {
  if (address != 0) return Status::Ok();
  return Status::InvalidArgument(std::string("jax_mla split plan: the address of ") + name +
                                 " is null");
}

}  // namespace

bool SplitShapeSupported(std::int64_t num_heads, std::int64_t tokens_per_seq) {
  for (const Pair& p : kSupported) {
    if (p.gqa == num_heads && p.msq == tokens_per_seq) return true;
  }
  return false;
}

const char* SplitSupportedShapesText() { return "(16,1) (16,2) (16,4) (32,1) (64,1) (128,1)"; }

Status PlanSplit(const SplitProblem& p, LaunchPlan* plan) {
  if (!SplitShapeSupported(p.num_heads, p.tokens_per_seq)) {
    return Status::InvalidArgument(
        "jax_mla split plan: (num_heads, tokens_per_seq) = (" + std::to_string(p.num_heads) + "," +
        std::to_string(p.tokens_per_seq) + ") is not served by the nm kernel; supported (gqa, " +
        "tokens_per_seq): " + SplitSupportedShapesText());
  }
  if (p.num_kv_splits < 1) {
    return Status::InvalidArgument("jax_mla split plan: num_kv_splits = " +
                                   std::to_string(p.num_kv_splits) + ", must be >= 1");
  }
  if (p.num_seqs < 1) {
    return Status::InvalidArgument("jax_mla split plan: num_seqs = " + std::to_string(p.num_seqs) +
                                   ", must be >= 1 (launch nothing for an empty batch)");
  }
  const bool split = p.num_kv_splits > 1;
  JAX_MLA_RETURN_IF_ERROR(RequireAddress(p.out, split ? "partials" : "out"));
  JAX_MLA_RETURN_IF_ERROR(RequireAddress(p.q, "q"));
  JAX_MLA_RETURN_IF_ERROR(RequireAddress(p.q_rope, "q_rope"));
  JAX_MLA_RETURN_IF_ERROR(RequireAddress(p.kv, "kv"));
  JAX_MLA_RETURN_IF_ERROR(RequireAddress(p.kv_rope, "kv_rope"));
  JAX_MLA_RETURN_IF_ERROR(RequireAddress(p.kv_indptr, "kv_indptr"));
  JAX_MLA_RETURN_IF_ERROR(RequireAddress(p.kv_indices, "kv_indices"));
  JAX_MLA_RETURN_IF_ERROR(RequireAddress(p.qo_indptr, "qo_indptr"));
  JAX_MLA_RETURN_IF_ERROR(RequireAddress(p.split_indptr, "split_indptr"));
  JAX_MLA_RETURN_IF_ERROR(RequireAddress(p.sink, "sink"));  // the kernel reads it: never null
  if (split) {
    JAX_MLA_RETURN_IF_ERROR(RequireAddress(p.partial_lse, "partial_lse"));
    JAX_MLA_RETURN_IF_ERROR(RequireAddress(p.valid_split_count, "valid_split_count"));
  }

  LaunchPlan result;  // kernargs start all zero: every unlisted byte stays zero
  result.kernel = KernelId::kSplitNm;
  namespace s = split_slot;
  PutKernarg<std::uint64_t>(result, s::kOut, p.out);
  PutKernarg<std::uint64_t>(result, s::kPartialLse, split ? p.partial_lse : 0);
  PutKernarg<std::uint64_t>(result, s::kQ, p.q);
  PutKernarg<std::uint64_t>(result, s::kKv, p.kv);
  PutKernarg<std::uint64_t>(result, s::kKvIndptr, p.kv_indptr);
  PutKernarg<std::uint64_t>(result, s::kKvPageIndices, p.kv_indices);
  PutKernarg<std::uint64_t>(result, s::kKvLastPageLens, 0);
  PutKernarg<float>(result, s::kSoftmaxScale, static_cast<float>(1.0 / std::sqrt(512.0)));
  PutKernarg<std::uint32_t>(result, s::kGqa, static_cast<std::uint32_t>(p.num_heads));
  PutKernarg<std::uint32_t>(result, s::kNumKvSplits, static_cast<std::uint32_t>(p.num_kv_splits));
  PutKernarg<std::uint32_t>(result, s::kTotalKv, 0);
  PutKernarg<std::uint32_t>(result, s::kStridePage, 0);
  PutKernarg<std::uint32_t>(result, s::kLog2PageSize, 0);
  PutKernarg<std::uint64_t>(result, s::kQoIndptr, p.qo_indptr);
  PutKernarg<std::uint64_t>(result, s::kSplitIndptr, p.split_indptr);
  PutKernarg<std::uint32_t>(result, s::kBf16Direct, split ? 0u : 1u);
  PutKernarg<std::uint64_t>(result, s::kQRope, p.q_rope);
  PutKernarg<std::uint64_t>(result, s::kKvRope, p.kv_rope);
  PutKernarg<std::uint64_t>(result, s::kSink, p.sink);
  PutKernarg<std::uint64_t>(result, s::kValidSplitCount, split ? p.valid_split_count : 0);
  PutKernarg<std::uint32_t>(result, s::kWriteValidCount, split ? 1u : 0u);

  const std::int64_t rows = p.num_heads * p.tokens_per_seq;
  const std::int64_t sub_q = rows < kSplitMaxSubQ ? rows : kSplitMaxSubQ;
  result.grid.x = static_cast<std::uint32_t>((rows + sub_q - 1) / sub_q);
  result.grid.y = static_cast<std::uint32_t>(p.num_seqs);
  result.grid.z = static_cast<std::uint32_t>(p.num_kv_splits);
  result.block = Dim3{kBlockThreads, 1, 1};
  result.shared_mem_bytes = 0;
  *plan = result;
  return Status::Ok();
}

}  // namespace jax_mla
