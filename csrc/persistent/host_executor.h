// Runs a persistent-kernel (nm_ps) LaunchPlan on the CPU, following the kernel's documented
// contract (KERNELS.md sections 1, 2 and 4). Every pointer and scalar comes back out of the plan's
// kernarg bytes, so a value in the wrong slot breaks the host backend just as it would the GPU.
//
// How the KV is split over the P partitions (the host's own choice; the real kernel's in-kernel
// planner is not published, so this only has to honour the same workspace shapes and rules):
//   - Each row's KV entries are cut into 32-token tiles (the last one may be short); the tiles of
//     all rows are laid end to end in row order, T tiles in total.
//   - Partition p owns the contiguous global tile range [p*C, min((p+1)*C, T)), C = ceil(T/P).
//   - A row whose tiles all lie in one partition is finished there: out and lse written directly.
//   - A row cut by a partition boundary leaves one piece in every partition it touches. A
//     partition holds at most two such pieces: slot 0 for the row that contains its first tile,
//     slot 1 for the row that contains its last tile (when that is a different row). A piece is
//     written, normalised, to o_acc[2p + slot] and its log2-domain lse (no sink) to
//     lse_acc[2p + slot]; desc[p] records the partition's tile range and its cut rows.
//   - Workgroup 2p + h (h = 0, 1) of partition p computes heads [64h, 64h + 64). Each piece bumps
//     the arrival counter cnt[2r + h] of its row r and head half; the last arrival merges the row's
//     pieces in partition order (deterministic), adds the sink once, writes out and lse, and sets
//     the counter back to 0. So cnt is all zero after every completed call.
//   - Rows with K = 0 own no tiles and are not written (the kernel's contract).
#ifndef JAX_MLA_PERSISTENT_HOST_EXECUTOR_H_
#define JAX_MLA_PERSISTENT_HOST_EXECUTOR_H_

#include <cstdint>

#include "common/launch_plan.h"
#include "common/status.h"

namespace jax_mla {

// Buffer extents in elements of the buffers the plan points at. Used only to refuse reads and
// writes outside them (an out-of-range kv index would be a wild read on the GPU); never as a
// second route for addresses or the problem's scalars.
struct PersistentHostBounds {
  std::uint64_t q_rows = 0;           // q [q_rows, 128, 512] u8, q_rope [q_rows, 128, 64]
  std::uint64_t kv_rows = 0;          // kv [kv_rows, 512] u8, kv_rope [kv_rows, 64]
  std::uint64_t kv_indptr_len = 0;
  std::uint64_t kv_indices_len = 0;
  std::uint64_t out_rows = 0;         // out [out_rows, 128, 512] bf16
  std::uint64_t lse_rows = 0;         // lse [lse_rows, 128] f32 (0 when no lse)
  std::uint64_t acc_slots = 0;        // o_acc [acc_slots, 128, 512], lse_acc [acc_slots, 128]
  std::uint64_t desc_rows = 0;        // desc [desc_rows, 8]
  std::uint64_t cnt_len = 0;
  std::uint64_t arange_len = 0;
};

struct PersistentHostOptions {
  // First fill what the kernel leaves unwritten (out and lse of rows with K = 0) with NaN, so
  // tests can see that the public wrapper's fix-up covers exactly those rows.
  bool fill_unwritten_nan = false;
  // Worker threads; 0 = one per CPU this process may use (host::HostThreads()).
  unsigned num_threads = 0;
};

// InvalidArgument for a malformed plan or an index outside `bounds` (naming the entry);
// FailedPrecondition when the workspace counters are not all zero on entry.
Status ExecutePersistentOnHost(const LaunchPlan& plan, const PersistentHostBounds& bounds,
                               const PersistentHostOptions& options);

}  // namespace jax_mla

#endif  // JAX_MLA_PERSISTENT_HOST_EXECUTOR_H_
