#include "split/host_executor.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "host/attention_tile.h"
#include "host/bf16.h"
#include "host/parallel_workgroups.h"
#include "host/row_format.h"
#include "split/kernargs.h"
#include "split/plan.h"

namespace jax_mla {
namespace {

using host::kHeadDim;
using host::kRopeDim;
using host::kRowBytes;
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// A block of the host core holds every row group of a sequence (at most 128 rows, 2 groups).
static_assert(2 * kSplitMaxSubQ == host::kMaxQueryRows);

float LogAddExp(float a, float b) {
  const float hi = std::max(a, b), lo = std::min(a, b);
  if (hi == -kInf) return -kInf;
  if (hi == kInf) return kInf;
  return hi + std::log1p(std::exp(lo - hi));
}

// Everything the executor reads, decoded from the kernarg bytes and nowhere else.
struct SplitArgs {
  void* out;
  float* partial_lse;
  const std::uint8_t* q;
  const std::uint8_t* kv;
  const std::int32_t* kv_indptr;
  const std::int32_t* kv_indices;
  float scale;
  std::int64_t gqa;
  std::int64_t num_splits;
  const std::int32_t* qo_indptr;
  const std::int32_t* split_indptr;
  bool bf16_direct;
  const std::uint16_t* q_rope;
  const std::uint16_t* kv_rope;
  const float* sink;
  std::int32_t* valid_split_count;
  bool write_valid_count;
  Dim3 grid;
};

template <typename T>
T* PointerAt(const LaunchPlan& plan, std::size_t offset) {
  return reinterpret_cast<T*>(static_cast<std::uintptr_t>(GetKernarg<std::uint64_t>(plan, offset)));
}

SplitArgs Decode(const LaunchPlan& plan) {
  namespace s = split_slot;
  SplitArgs a;
  a.out = PointerAt<void>(plan, s::kOut);
  a.partial_lse = PointerAt<float>(plan, s::kPartialLse);
  a.q = PointerAt<const std::uint8_t>(plan, s::kQ);
  a.kv = PointerAt<const std::uint8_t>(plan, s::kKv);
  a.kv_indptr = PointerAt<const std::int32_t>(plan, s::kKvIndptr);
  a.kv_indices = PointerAt<const std::int32_t>(plan, s::kKvPageIndices);
  a.scale = GetKernarg<float>(plan, s::kSoftmaxScale);
  a.gqa = GetKernarg<std::uint32_t>(plan, s::kGqa);
  a.num_splits = GetKernarg<std::uint32_t>(plan, s::kNumKvSplits);
  a.qo_indptr = PointerAt<const std::int32_t>(plan, s::kQoIndptr);
  a.split_indptr = PointerAt<const std::int32_t>(plan, s::kSplitIndptr);
  a.bf16_direct = GetKernarg<std::uint32_t>(plan, s::kBf16Direct) != 0;
  a.q_rope = PointerAt<const std::uint16_t>(plan, s::kQRope);
  a.kv_rope = PointerAt<const std::uint16_t>(plan, s::kKvRope);
  a.sink = PointerAt<const float>(plan, s::kSink);
  a.valid_split_count = PointerAt<std::int32_t>(plan, s::kValidSplitCount);
  a.write_valid_count = GetKernarg<std::uint32_t>(plan, s::kWriteValidCount) != 0;
  a.grid = plan.grid;
  return a;
}

std::string Str(std::int64_t v) { return std::to_string(v); }

Status Invalid(const std::string& what) {
  return Status::InvalidArgument("jax_mla host split executor: " + what);
}

Status CheckNonNull(const void* p, const char* slot) {
  return p ? Status::Ok() : Invalid(std::string("kernarg ") + slot + " is null");
}

Status CheckIndptr(const std::int32_t* indptr, std::int64_t n, std::int64_t limit, const char* name) {
  for (std::int64_t b = 0; b <= n; ++b) {
    const std::int64_t v = indptr[b];
    if (v < 0 || v > limit) {
      return Invalid(std::string(name) + "[" + Str(b) + "] = " + Str(v) + " is outside [0, " +
                     Str(limit) + "]");
    }
    if (b > 0 && v < indptr[b - 1]) {
      return Invalid(std::string(name) + "[" + Str(b) + "] = " + Str(v) + " < " + name + "[" +
                     Str(b - 1) + "] = " + Str(indptr[b - 1]));
    }
  }
  return Status::Ok();
}

// Refuses, before anything runs, whatever would read or write outside the buffers.
Status Validate(const SplitArgs& a, const SplitHostBounds& bounds, const LaunchPlan& plan) {
  namespace s = split_slot;
  JAX_MLA_RETURN_IF_ERROR(CheckNonNull(a.out, "slot 0 (out / partials)"));
  JAX_MLA_RETURN_IF_ERROR(CheckNonNull(a.q, "slot 2 (q)"));
  JAX_MLA_RETURN_IF_ERROR(CheckNonNull(a.kv, "slot 3 (kv)"));
  JAX_MLA_RETURN_IF_ERROR(CheckNonNull(a.kv_indptr, "slot 4 (kv_indptr)"));
  JAX_MLA_RETURN_IF_ERROR(CheckNonNull(a.kv_indices, "slot 5 (kv_page_indices)"));
  JAX_MLA_RETURN_IF_ERROR(CheckNonNull(a.qo_indptr, "slot 13 (qo_indptr)"));
  JAX_MLA_RETURN_IF_ERROR(CheckNonNull(a.split_indptr, "slot 14 (split_indptr)"));
  JAX_MLA_RETURN_IF_ERROR(CheckNonNull(a.q_rope, "slot 16 (q rope)"));
  JAX_MLA_RETURN_IF_ERROR(CheckNonNull(a.kv_rope, "slot 17 (kv rope)"));
  JAX_MLA_RETURN_IF_ERROR(CheckNonNull(a.sink, "slot 18 (sink)"));
  // Page size 1 only: the slots that would describe pages must be the documented zeros.
  const std::pair<std::size_t, const char*> zero_slots[] = {
      {s::kKvLastPageLens, "slot 6 (kv_last_page_lens)"}, {s::kTotalKv, "slot 10 (total_kv)"},
      {s::kStridePage, "slot 11 (stride_page)"}, {s::kLog2PageSize, "slot 12 (log2 page size)"}};
  for (const auto& [offset, name] : zero_slots) {
    if (GetKernarg<std::uint64_t>(plan, offset) != 0) {
      return Invalid(std::string("kernarg ") + name + " must be 0 (page size 1)");
    }
  }
  if (a.gqa != bounds.num_heads) {
    return Invalid("kernarg slot 8 (gqa) = " + Str(a.gqa) + " but q has " +
                   Str(bounds.num_heads) + " heads");
  }
  if (a.num_splits != bounds.num_kv_splits || a.bf16_direct != (bounds.num_kv_splits == 1)) {
    return Invalid("kernarg slots 9/15 (num_kv_splits " + Str(a.num_splits) + ", bf16_direct " +
                   Str(a.bf16_direct) + ") disagree with the output buffers (S = " +
                   Str(bounds.num_kv_splits) + ")");
  }
  if (!a.bf16_direct) {
    JAX_MLA_RETURN_IF_ERROR(CheckNonNull(a.partial_lse, "slot 1 (partial LSE)"));
  }
  if (a.write_valid_count) {
    JAX_MLA_RETURN_IF_ERROR(CheckNonNull(a.valid_split_count, "slot 19 (valid split count)"));
  }
  if (a.grid.y > bounds.num_seqs || a.grid.z > a.num_splits) {
    return Invalid("grid (" + Str(a.grid.x) + ", " + Str(a.grid.y) + ", " + Str(a.grid.z) +
                   ") exceeds num_seqs " + Str(bounds.num_seqs) + " or num_kv_splits " +
                   Str(a.num_splits));
  }
  const std::int64_t num_seqs = a.grid.y;
  JAX_MLA_RETURN_IF_ERROR(CheckIndptr(a.qo_indptr, num_seqs, bounds.q_tokens, "qo_indptr"));
  JAX_MLA_RETURN_IF_ERROR(CheckIndptr(a.kv_indptr, num_seqs, bounds.kv_indices, "kv_indptr"));
  for (std::int64_t b = 0; b <= num_seqs; ++b) {  // uniform [0, S, 2S, ...] is all we implement
    if (a.split_indptr[b] != b * a.num_splits) {
      return Invalid("split_indptr[" + Str(b) + "] = " + Str(a.split_indptr[b]) + ", expected " +
                     Str(b * a.num_splits) + " (uniform, S = " + Str(a.num_splits) + ")");
    }
  }
  // Only the entries a sequence owns are read; trailing entries may hold anything.
  for (std::int64_t i = a.kv_indptr[0]; i < a.kv_indptr[num_seqs]; ++i) {
    const std::int64_t row = a.kv_indices[i];
    if (row < 0 || row >= bounds.kv_rows) {
      return Invalid("kv_indices[" + Str(i) + "] = " + Str(row) + " is outside [0, " +
                     Str(bounds.kv_rows) + ") (kv has " + Str(bounds.kv_rows) + " rows)");
    }
  }
  return Status::Ok();
}

void FillUnwritten(const SplitArgs& a, const SplitHostBounds& bounds) {
  const std::int64_t rows = bounds.q_tokens * bounds.num_heads;
  if (a.bf16_direct) {
    std::fill_n(static_cast<std::uint16_t*>(a.out), rows * kHeadDim, host::kBf16QuietNan);
  } else {
    std::fill_n(static_cast<float*>(a.out), rows * a.num_splits * kHeadDim, kNan);
    std::fill_n(a.partial_lse, rows * a.num_splits, kNan);
  }
  // -1 makes the merge see no valid split, so a count the kernel failed to write shows up.
  if (a.valid_split_count) std::fill_n(a.valid_split_count, bounds.num_seqs, -1);
}

// Whether the grid's workgroups cover every output row of every sequence (qo_indptr splits
// [0, T) among the grid's sequences, none has more rows than its row groups hold): then every
// output slot is written by the workgroups or is one of the slots FillTaskUnwritten fills, and
// the whole-buffer fill is not needed.
bool CoversEveryRow(const SplitArgs& a, const SplitHostBounds& bounds) {
  if (a.grid.y != bounds.num_seqs || a.qo_indptr[0] != 0 ||
      a.qo_indptr[a.grid.y] != bounds.q_tokens) {
    return false;
  }
  for (std::int64_t b = 0; b < a.grid.y; ++b) {
    const std::int64_t rows = a.gqa * (a.qo_indptr[b + 1] - a.qo_indptr[b]);
    if (rows > std::int64_t{a.grid.x} * std::min<std::int64_t>(kSplitMaxSubQ, rows)) return false;
  }
  return true;
}

// Merging needs every row owned by a task and every split run, into outputs that are there.
Status ValidateMerge(const SplitArgs& a, const SplitHostBounds& bounds,
                     const SplitHostMerge& merge) {
  if (merge.lse == nullptr) return Invalid("the merged lse output is null");
  if (a.bf16_direct && merge.out != a.out) {
    return Invalid("with one split the merged out must be the kernel's out (slot 0)");
  }
  if (a.grid.z != a.num_splits || !CoversEveryRow(a, bounds)) {
    return Invalid("merging needs a grid that runs every split of every row of every sequence");
  }
  return Status::Ok();
}

// NaN into the slots of (sequence b, split) that its workgroups leave unwritten: the split's
// partials and partial LSE when the split is empty, the sequence's output rows when it has no
// entries and S == 1.
void FillTaskUnwritten(const SplitArgs& a, std::int64_t b, std::int64_t split, bool split_empty) {
  const std::int64_t heads = a.gqa;
  for (std::int64_t t = a.qo_indptr[b]; t < a.qo_indptr[b + 1]; ++t) {
    if (a.bf16_direct) {
      std::fill_n(static_cast<std::uint16_t*>(a.out) + t * heads * kHeadDim, heads * kHeadDim,
                  host::kBf16QuietNan);
    } else if (split_empty) {
      const std::int64_t slot = (t * a.num_splits + split) * heads;
      std::fill_n(static_cast<float*>(a.out) + slot * kHeadDim, heads * kHeadDim, kNan);
      std::fill_n(a.partial_lse + slot, heads, kNan);
    }
  }
}

// The block's row `row` is over the scores s_n of this split: acc = sum w_n v_n, weight_sum =
// sum w_n (the weights PV used), row_sum = sum exp(s_n - row_max).
void WriteOutputRow(const SplitArgs& a, const SplitHostMerge& merge, std::int64_t token,
                    std::int64_t head, std::int64_t split, const float* acc, float row_max,
                    float row_sum, float weight_sum) {
  const float sink = a.sink[head];
  const std::int64_t heads = a.gqa;
  if (a.bf16_direct) {  // final output: the sink joins the denominator only
    std::uint16_t* out = static_cast<std::uint16_t*>(a.out) + (token * heads + head) * kHeadDim;
    float factor = 0.0f;  // +inf sink: every probability is 0
    if (sink != kInf) {
      const float m = std::max(row_max, sink);
      const float kept = row_sum * std::exp(row_max - m);
      factor = kept / ((kept + std::exp(sink - m)) * weight_sum);  // the entries' share
    }
    for (int d = 0; d < kHeadDim; ++d) out[d] = host::FloatToBf16(acc[d] * factor);
    if (merge.enabled()) {
      merge.lse[token * heads + head] = LogAddExp(row_max + std::log(row_sum), sink);
    }
    return;
  }
  float lse = row_max + std::log(row_sum);
  float factor = 1.0f / weight_sum;
  if (split == 0 && sink != -kInf) {  // fold the sink into split 0, exactly once
    const float folded = LogAddExp(lse, sink);
    factor *= std::exp(lse - folded);  // +inf sink: exp(-inf) = 0
    lse = folded;
  }
  const std::int64_t slot = (token * a.num_splits + split) * heads + head;
  float* out = static_cast<float*>(a.out) + slot * kHeadDim;
  for (int d = 0; d < kHeadDim; ++d) out[d] = acc[d] * factor;
  a.partial_lse[slot] = lse;
}

// The merged outputs of sequence b's rows when it has no entries: out 0, lse = sink.
void WriteEmptyRows(const SplitArgs& a, const SplitHostMerge& merge, std::int64_t b) {
  const std::int64_t heads = a.gqa;
  for (std::int64_t t = a.qo_indptr[b]; t < a.qo_indptr[b + 1]; ++t) {
    std::fill_n(merge.out + t * heads * kHeadDim, heads * kHeadDim, std::uint16_t{0});
    std::copy_n(a.sink, heads, merge.lse + t * heads);
  }
}

// Sequence b's KV entries, its tiles and the tiles of each split (the split rule in the header).
struct Tiling {
  std::int64_t kv_len, tiles, tiles_per_split;
};

Tiling TilingOf(const SplitArgs& a, std::int64_t b) {
  const std::int64_t kv_len = a.kv_indptr[b + 1] - a.kv_indptr[b];
  const std::int64_t tiles = (kv_len + kSplitKvTile - 1) / kSplitKvTile;
  return {kv_len, tiles, (tiles + a.num_splits - 1) / a.num_splits};
}

// The number of non-empty splits of sequence b: its first ones.
std::int64_t ValidSplits(const SplitArgs& a, std::int64_t b) {
  const Tiling t = TilingOf(a, b);
  return t.tiles == 0 ? 0 : (t.tiles + t.tiles_per_split - 1) / t.tiles_per_split;
}

// Sequence b's splits merged into the final outputs (the contract in host_executor.h), once all
// of them are written.
void MergeSequence(const SplitArgs& a, const SplitHostMerge& merge, std::int64_t b) {
  const std::int64_t valid = ValidSplits(a, b);
  if (valid == 0) return WriteEmptyRows(a, merge, b);
  const std::int64_t heads = a.gqa, splits = a.num_splits;
  const float* partials = static_cast<const float*>(a.out);
  std::vector<float> weights(static_cast<std::size_t>(valid));
  float acc[kHeadDim];
  for (std::int64_t t = a.qo_indptr[b]; t < a.qo_indptr[b + 1]; ++t) {
    for (std::int64_t h = 0; h < heads; ++h) {
      std::uint16_t* out = merge.out + (t * heads + h) * kHeadDim;
      float* lse = merge.lse + t * heads + h;
      const auto slot = [&](std::int64_t s) { return (t * splits + s) * heads + h; };
      // A NaN lse is skipped by the max, but its weight (x == m is false) is NaN: so are den,
      // the row's out and its lse, as in XLA.
      float m = -kInf;
      for (std::int64_t s = 0; s < valid; ++s) m = std::max(m, a.partial_lse[slot(s)]);
      float den = 0.0f;
      for (std::int64_t s = 0; s < valid; ++s) {
        const float x = a.partial_lse[slot(s)];
        weights[s] = x == m ? 1.0f : std::exp(x - m);
        den += weights[s];
      }
      std::fill_n(acc, kHeadDim, 0.0f);
      for (std::int64_t s = 0; s < valid; ++s) {
        const float* o = partials + slot(s) * kHeadDim;
        for (int d = 0; d < kHeadDim; ++d) acc[d] += weights[s] * o[d];
      }
      for (int d = 0; d < kHeadDim; ++d) out[d] = host::FloatToBf16(acc[d] / den);
      *lse = m + std::log(den);
    }
  }
}

// The KV entries [lo, hi) of split `split` of sequence b (the split rule above).
struct SplitRange {
  std::int64_t lo = 0, hi = 0;
};

SplitRange RangeOf(const SplitArgs& a, std::int64_t b, std::int64_t split) {
  const Tiling t = TilingOf(a, b);
  SplitRange r;
  r.lo = std::min(t.kv_len, split * t.tiles_per_split * kSplitKvTile);
  r.hi = std::min(t.kv_len, (split + 1) * t.tiles_per_split * kSplitKvTile);
  return r;
}

// Workgroups (x, b, split) for every x at once: the row groups of a (sequence, split) read the
// same KV entries, so on the host they run as one block of up to 128 rows and dequantize each KV
// row once. A row's result does not depend on which rows share its block.
void RunTask(const SplitArgs& a, const SplitHostMerge& merge, std::int64_t b, std::int64_t split,
             bool fill_unwritten, std::uint64_t call_id, host::QueryBlock& block) {
  const std::int64_t heads = a.gqa;
  const std::int64_t token0 = a.qo_indptr[b];
  const std::int64_t seq_rows = heads * (a.qo_indptr[b + 1] - token0);
  const std::int64_t kv_begin = a.kv_indptr[b];
  if (a.write_valid_count && split == 0) {
    a.valid_split_count[b] = static_cast<std::int32_t>(ValidSplits(a, b));
  }
  const SplitRange range = RangeOf(a, b, split);
  const bool writes = seq_rows > 0 && range.lo < range.hi;
  if (!writes && a.bf16_direct && merge.enabled()) {  // merged output of an empty sequence
    return WriteEmptyRows(a, merge, b);
  }
  if (fill_unwritten && !writes) FillTaskUnwritten(a, b, split, true);
  if (!writes) return;  // an empty split writes nothing
  const std::int64_t sub_q = std::min<std::int64_t>(kSplitMaxSubQ, seq_rows);
  const std::int64_t rows = std::min(seq_rows, std::int64_t{a.grid.x} * sub_q);
  const std::int64_t first_row = token0 * heads;  // (token, head) rows, token-major
  for (std::int64_t row0 = 0; row0 < rows; row0 += host::kMaxQueryRows) {
    const int num_rows = static_cast<int>(std::min<std::int64_t>(host::kMaxQueryRows, rows - row0));
    const host::KvRows kv{a.kv, a.kv_rope};
    const std::int32_t* ids = a.kv_indices + kv_begin + range.lo;
    host::LoadQueryRowsOnce(a.q + (first_row + row0) * kRowBytes,
                            a.q_rope + (first_row + row0) * kRopeDim, num_rows, call_id, block,
                            host::KvPrefetch{kv, ids, range.hi - range.lo});
    host::AttendKvRows(kv, ids, range.hi - range.lo, a.scale, block);
    for (int r = 0; r < num_rows; ++r) {
      const std::int64_t local = row0 + r;
      WriteOutputRow(a, merge, token0 + local / heads, local % heads, split, block.Acc(r),
                     block.max[r], block.sum[r], block.weight_sum[r]);
    }
  }
}

}  // namespace

Status ExecuteSplitOnHost(const LaunchPlan& plan, const SplitHostBounds& bounds,
                          const SplitHostOptions& options) {
  if (plan.kernel != KernelId::kSplitNm) return Invalid("the plan is not for the nm kernel");
  const SplitArgs args = Decode(plan);
  JAX_MLA_RETURN_IF_ERROR(Validate(args, bounds, plan));
  const SplitHostMerge& merge = options.merge;
  if (merge.enabled()) JAX_MLA_RETURN_IF_ERROR(ValidateMerge(args, bounds, merge));
  // Unwritten slots are filled by the task that leaves them, unless the grid leaves rows that no
  // task owns: then the whole outputs first.
  const bool fill_per_task = options.fill_unwritten_nan && CoversEveryRow(args, bounds);
  if (options.fill_unwritten_nan && !fill_per_task) FillUnwritten(args, bounds);

  // Tasks (sequence, split), the longest sequences first (ties in order), so that the threads
  // finish together on ragged batches; a sequence's splits stay neighbours, and with claims
  // from both ends a thread usually runs them in turn, loading Q once. The order changes no
  // result.
  const std::int64_t gy = plan.grid.y, gz = plan.grid.z;
  std::vector<std::pair<std::int64_t, std::int64_t>> order;  // (-entries, task)
  order.reserve(static_cast<std::size_t>(gy * gz));
  for (std::int64_t task = 0; task < gy * gz; ++task) {
    const std::int64_t b = task / gz;
    order.emplace_back(-(args.kv_indptr[b + 1] - args.kv_indptr[b]), task);
  }
  std::sort(order.begin(), order.end());
  const std::uint64_t call_id = host::NewCallId();
  const unsigned max_threads = options.num_threads > 0 ? options.num_threads : 0;
  // Per sequence, its splits written so far: the task that writes the last one merges.
  const bool merge_splits = merge.enabled() && !args.bf16_direct;
  std::unique_ptr<std::atomic<std::int32_t>[]> splits_done;
  if (merge_splits) splits_done.reset(new std::atomic<std::int32_t>[gy]());
  const bool done = host::RunWorkgroups<host::QueryBlock>(
      gy * gz, max_threads, [&](std::int64_t id, host::QueryBlock& block) {
        const std::int64_t task = order[static_cast<std::size_t>(id)].second;
        const std::int64_t b = task / gz;
        RunTask(args, merge, b, task % gz, fill_per_task, call_id, block);
        // acq_rel: the merging thread sees every split's partials.
        if (merge_splits && splits_done[b].fetch_add(1, std::memory_order_acq_rel) + 1 == gz) {
          MergeSequence(args, merge, b);
        }
      }, /*both_ends=*/true);
  if (!done) {
    return Status::Internal(
        "jax_mla host split executor: a worker failed (out of memory?); outputs are incomplete");
  }
  return Status::Ok();
}

}  // namespace jax_mla
