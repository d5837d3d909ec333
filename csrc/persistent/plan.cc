#include "persistent/plan.h"

#include <cmath>
#include <cstring>
#include <string>

#include "persistent/kernargs.h"

namespace jax_mla {
namespace {

Status CheckAddress(std::uint64_t address, const char* name) {
  if (address == 0) {
    return Status::InvalidArgument(std::string("jax_mla persistent plan: the address of ") + name +
                                   " is null");
  }
  return Status::Ok();
}

}  // namespace

Status PlanPersistent(const PersistentProblem& p, LaunchPlan* plan) {
  if (p.num_heads != kPersistentHeads) {
    return Status::InvalidArgument("jax_mla persistent plan: the nm_ps kernel needs exactly 128 "
                                   "query heads, got " + std::to_string(p.num_heads));
  }
  if (p.num_rows > kPersistentMaxRows) {
    return Status::InvalidArgument(
        "jax_mla persistent plan: at most 32768 rows (the kernel's byte offsets wrap above it), "
        "got N=" + std::to_string(p.num_rows));
  }
  if (p.num_partitions < 1 || p.num_partitions > kPersistentMaxPartitions) {
    return Status::InvalidArgument("jax_mla persistent plan: num_partitions must be in [1, 1024], "
                                   "got " + std::to_string(p.num_partitions));
  }
  const struct { std::uint64_t address; const char* name; } required[] = {
      {p.q, "q"}, {p.q_rope, "q_rope"}, {p.kv, "kv"}, {p.kv_rope, "kv_rope"},
      {p.kv_indptr, "kv_indptr"}, {p.kv_indices, "kv_indices"}, {p.sink, "sink"},
      {p.out, "out"}, {p.o_acc, "o_acc"}, {p.lse_acc, "lse_acc"}, {p.desc, "desc"},
      {p.cnt, "cnt"}, {p.arange, "arange"}};
  for (const auto& r : required) JAX_MLA_RETURN_IF_ERROR(CheckAddress(r.address, r.name));
  if (p.return_lse) JAX_MLA_RETURN_IF_ERROR(CheckAddress(p.lse, "lse (return_lse is set)"));

  PersistentKernargs args{};  // value-initialised: every reserved byte is zero
  args.o_acc = p.o_acc;
  args.out = p.out;
  args.lse_acc = p.lse_acc;
  args.lse = p.return_lse ? p.lse : 0;
  args.q = p.q;
  args.kv = p.kv;
  args.kv_indptr = p.kv_indptr;
  args.kv_indices = p.kv_indices;
  args.desc = p.desc;
  args.softmax_scale = static_cast<float>(1.0 / std::sqrt(512.0));
  args.num_heads = p.num_heads;
  args.one_090 = 1;
  args.cnt = p.cnt;
  args.num_partitions = p.num_partitions;
  args.num_rows = p.num_rows;
  args.planner_config = p.planner_config;
  args.qo_indptr = p.arange;
  args.split_indptr = p.arange;
  args.bf16_output = 1;
  args.q_rope = p.q_rope;
  args.kv_rope = p.kv_rope;
  args.sink = p.sink;

  LaunchPlan out;
  out.kernel = KernelId::kPersistentNmPs;
  std::memcpy(out.kernargs.data(), &args, sizeof(args));
  out.grid = Dim3{2 * p.num_partitions, 1, 1};
  out.block = Dim3{kBlockThreads, 1, 1};
  out.shared_mem_bytes = 0;
  *plan = out;
  return Status::Ok();
}

}  // namespace jax_mla
