#include "split/host_executor.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

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

// The shared tile core is the kernel's workgroup: 64 query rows, 32-entry KV tiles.
static_assert(kSplitMaxSubQ == host::kMaxQueryRows && kSplitKvTile == host::kTileTokens);

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

void WriteOutputRow(const SplitArgs& a, std::int64_t token, std::int64_t head, std::int64_t split,
                    const float* acc, float row_max, float row_sum) {
  const float sink = a.sink[head];
  const std::int64_t heads = a.gqa;
  if (a.bf16_direct) {  // final output: the sink joins the denominator only
    std::uint16_t* out = static_cast<std::uint16_t*>(a.out) + (token * heads + head) * kHeadDim;
    float factor = 0.0f;  // +inf sink: every probability is 0
    if (sink != kInf) {
      const float m = std::max(row_max, sink);
      const float kept = std::exp(row_max - m);
      factor = kept / (row_sum * kept + std::exp(sink - m));
    }
    for (int d = 0; d < kHeadDim; ++d) out[d] = host::FloatToBf16(acc[d] * factor);
    return;
  }
  float lse = row_max + std::log(row_sum);
  float factor = 1.0f / row_sum;
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

void RunWorkgroup(const SplitArgs& a, std::int64_t x, std::int64_t b, std::int64_t split,
                  host::QueryBlock& block) {
  const std::int64_t heads = a.gqa;
  const std::int64_t token0 = a.qo_indptr[b];
  const std::int64_t seq_rows = heads * (a.qo_indptr[b + 1] - token0);
  const std::int64_t kv_begin = a.kv_indptr[b];
  const std::int64_t kv_len = a.kv_indptr[b + 1] - kv_begin;
  const std::int64_t tiles = (kv_len + kSplitKvTile - 1) / kSplitKvTile;
  const std::int64_t tiles_per_split = (tiles + a.num_splits - 1) / a.num_splits;
  if (a.write_valid_count && x == 0 && split == 0) {
    a.valid_split_count[b] =
        static_cast<std::int32_t>(tiles == 0 ? 0 : (tiles + tiles_per_split - 1) / tiles_per_split);
  }
  if (seq_rows == 0 || kv_len == 0) return;
  const std::int64_t sub_q = std::min<std::int64_t>(kSplitMaxSubQ, seq_rows);
  const std::int64_t row0 = x * sub_q;
  const std::int64_t num_rows = std::min(sub_q, seq_rows - row0);
  const std::int64_t lo = split * tiles_per_split * kSplitKvTile;
  const std::int64_t hi = std::min(kv_len, (split + 1) * tiles_per_split * kSplitKvTile);
  if (num_rows <= 0 || lo >= hi) return;  // an empty split writes nothing

  const std::int64_t first_row = token0 * heads + row0;  // (token, head) rows, token-major
  host::LoadQueryRows(a.q + first_row * kRowBytes, a.q_rope + first_row * kRopeDim,
                      static_cast<int>(num_rows), block);
  host::AttendKvRows(host::KvRows{a.kv, a.kv_rope}, a.kv_indices + kv_begin + lo, hi - lo, a.scale,
                     block);
  for (std::int64_t r = 0; r < num_rows; ++r) {
    const std::int64_t local = row0 + r;
    WriteOutputRow(a, token0 + local / heads, local % heads, split, block.Acc(static_cast<int>(r)),
                   block.max[r], block.sum[r]);
  }
}

}  // namespace

Status ExecuteSplitOnHost(const LaunchPlan& plan, const SplitHostBounds& bounds,
                          const SplitHostOptions& options) {
  if (plan.kernel != KernelId::kSplitNm) return Invalid("the plan is not for the nm kernel");
  const SplitArgs args = Decode(plan);
  JAX_MLA_RETURN_IF_ERROR(Validate(args, bounds, plan));
  if (options.fill_unwritten_nan) FillUnwritten(args, bounds);

  const std::int64_t gx = plan.grid.x, gy = plan.grid.y, gz = plan.grid.z;
  const unsigned max_threads = options.num_threads > 0 ? options.num_threads : 0;
  const bool done = host::RunWorkgroups<host::QueryBlock>(
      gx * gy * gz, max_threads, [&](std::int64_t id, host::QueryBlock& block) {
        // x fastest, then split, then sequence: neighbouring ids share a sequence's KV rows.
        const std::int64_t x = id % gx, z = (id / gx) % gz, y = id / (gx * gz);
        RunWorkgroup(args, x, y, z, block);
      });
  if (!done) {
    return Status::Internal(
        "jax_mla host split executor: a worker failed (out of memory?); outputs are incomplete");
  }
  return Status::Ok();
}

}  // namespace jax_mla
