// Executes a nm-kernel LaunchPlan on the CPU, following the kernel's documented contract
// (KERNELS.md sections 1-3). Every pointer and scalar comes out of the plan's kernarg bytes and
// the work is walked by the plan's grid, exactly like the GPU: a wrong slot or grid fails here.
//
// Work decomposition (as the kernel's): workgroup (x, y, z) = (query-row group, sequence, split).
// Sequence b owns tokens qo_indptr[b]..qo_indptr[b+1]; its (token, head) rows, token-major, are cut
// into groups of sub_q = min(64, gqa * tokens) rows; all its tokens attend to the same KV list
// kv_page_indices[kv_indptr[b]:kv_indptr[b+1]].
//
// KV split rule (ours: the real kernel's boundaries are not published; the merge only relies on
// each split being a disjoint range with a correct LSE): with K entries, tiles = ceil(K/32),
// tiles_per_split tps = ceil(tiles/S), split s covers entries [s*tps*32, min(K, (s+1)*tps*32)).
// A split with no entries writes nothing. valid_split_count[b] = number of non-empty splits
// (<= min(S, ceil(K/32))), written by workgroup (0, b, 0).
//
// Outputs. S == 1: bf16 out [T, H, 512] with the sink in the denominator; rows of sequences
// with K = 0 are not written. S > 1: fp32 partials [T, S, H, 512] (that split's normalized output)
// and natural-log partial LSE [T, S, H]; the sink is folded into split 0 exactly once
// (lse0' = logaddexp(lse0, sink), o0' = o0 * exp(lse0 - lse0')), as KERNELS.md infers the kernel
// does, so one merge serves both backends. A +inf sink gives o0' = 0, lse0' = +inf.
//
// Merging in the executor (SplitHostOptions::merge, the host backend's own ending: on gfx950 the
// merge runs in XLA). The task that finishes a sequence's last split merges that sequence's
// splits right away, on its thread, while the partials are in cache, and writes the final bf16
// out [T, H, 512] and natural-log lse [T, H] (the sink included) with the XLA merge's contract
// (aiter/split.py): over the sequence's non-empty splits, m = max lse, w = exp(lse - m) (1 where
// lse == m, so a +inf sink gives out 0, lse +inf), out = sum w o / sum w, lse = m + log(sum w);
// a NaN lse makes the row's out and lse NaN; a sequence without entries gets out 0, lse = sink.
// With S == 1 the kernel's bf16 out is the final out and the executor adds the lse (and those
// zero rows). No pass over the batch after the tasks, and no second wake of the threads.
#ifndef JAX_MLA_SPLIT_HOST_EXECUTOR_H_
#define JAX_MLA_SPLIT_HOST_EXECUTOR_H_

#include <cstdint>

#include "common/launch_plan.h"
#include "common/status.h"

namespace jax_mla {

// Sizes of the buffers behind the kernarg pointers, from the handler's buffer shapes. Used only
// to refuse (InvalidArgument) what would read or write out of bounds; never a source of values.
struct SplitHostBounds {
  std::int64_t q_tokens = 0;       // T: rows of q / q_rope / out
  std::int64_t num_heads = 0;      // H
  std::int64_t num_seqs = 0;       // B: kv_indptr, qo_indptr, split_indptr have B + 1 entries
  std::int64_t num_kv_splits = 0;  // S of the partial buffers (1: out is bf16)
  std::int64_t kv_rows = 0;        // R: rows of kv / kv_rope
  std::int64_t kv_indices = 0;     // L: entries of kv_page_indices
};

// Where the executor writes the merged results (both set) or nothing (both null: the kernel's
// own outputs only, for XLA's merge, as on gfx950).
struct SplitHostMerge {
  std::uint16_t* out = nullptr;  // bf16 [T, H, 512]; with S == 1 it is the kernel's out (slot 0)
  float* lse = nullptr;          // f32 [T, H]
  bool enabled() const { return out != nullptr; }
};

struct SplitHostOptions {
  // First fill every output the kernel may leave unwritten (the whole out / partials / partial
  // LSE) with NaN, so tests prove that nothing unwritten reaches a result.
  bool fill_unwritten_nan = false;
  int num_threads = 0;  // 0: one per CPU this process may use (host::HostThreads())
  SplitHostMerge merge;
};

Status ExecuteSplitOnHost(const LaunchPlan& plan, const SplitHostBounds& bounds,
                          const SplitHostOptions& options);

}  // namespace jax_mla

#endif  // JAX_MLA_SPLIT_HOST_EXECUTOR_H_
