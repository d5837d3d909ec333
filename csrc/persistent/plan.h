// The launch plan of the persistent kernel (nm_ps): a pure function from device addresses and a
// few integers to the 336 kernarg bytes and the launch geometry. The HIP launcher and the host
// executor both consume its output, so both see exactly the same bytes.
#ifndef JAX_MLA_PERSISTENT_PLAN_H_
#define JAX_MLA_PERSISTENT_PLAN_H_

#include <cstdint>

#include "common/launch_plan.h"
#include "common/status.h"

namespace jax_mla {

inline constexpr std::uint32_t kPersistentHeads = 128;
inline constexpr std::uint32_t kPersistentMaxRows = 32768;       // byte offsets wrap above it
inline constexpr std::uint32_t kPersistentMaxPartitions = 1024;
inline constexpr std::uint32_t kPersistentDefaultPlannerConfig = 6u | (1u << 8);
inline constexpr std::uint32_t kPersistentCntEntries = 2 * 65536 + 16 * 512 + 4 * 1024;

// Addresses are device (or, for the host backend, host) addresses as integers: no HIP or XLA
// types here. `lse` may be 0 when the caller wants no lse.
struct PersistentProblem {
  std::uint64_t q = 0, q_rope = 0, kv = 0, kv_rope = 0;
  std::uint64_t kv_indptr = 0, kv_indices = 0, sink = 0;
  std::uint64_t out = 0, lse = 0;
  std::uint64_t o_acc = 0, lse_acc = 0, desc = 0, cnt = 0, arange = 0;
  std::uint32_t num_rows = 0;        // N
  std::uint32_t num_partitions = 0;  // P
  std::uint32_t num_heads = kPersistentHeads;
  bool return_lse = true;            // false: the lse slot is 0, the kernel writes none
  std::uint32_t planner_config = kPersistentDefaultPlannerConfig;
};

// Grid (2P, 1, 1), block 256, no dynamic LDS. Rejects N > 32768, P outside [1, 1024], H != 128,
// null required addresses, and return_lse without an lse address.
Status PlanPersistent(const PersistentProblem& problem, LaunchPlan* plan);

}  // namespace jax_mla

#endif  // JAX_MLA_PERSISTENT_PLAN_H_
