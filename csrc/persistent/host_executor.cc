#include "persistent/host_executor.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "host/bf16.h"
#include "host/parallel_workgroups.h"
#include "host/row_format.h"
#include "persistent/host_attention.h"
#include "persistent/kernargs.h"
#include "persistent/plan.h"

namespace jax_mla {
namespace {

using host::kHeadDim;
using host::kHeadsPerWorkgroup;
using host::kRopeDim;
using host::kRowBytes;
constexpr std::int64_t kTileTokens = 32;  // the nm_ps kernel's KV tile: the unit of its partitions

constexpr const char* kWho = "jax_mla persistent decode (host backend): ";

// Everything the kernel reads, taken back out of the kernarg bytes.
struct Args {
  float* o_acc;
  std::uint16_t* out;
  float* lse_acc;
  float* lse;  // may be null
  const std::uint8_t* q;
  const std::uint8_t* kv;
  const std::int32_t* kv_indptr;
  const std::int32_t* kv_indices;
  std::int32_t* desc;
  std::uint32_t* cnt;
  const std::int32_t* qo_indptr;
  const std::int32_t* split_indptr;
  const std::uint16_t* q_rope;
  const std::uint16_t* kv_rope;
  const float* sink;
  float softmax_scale;
  std::uint32_t num_heads, one_090, bf16_output, num_partitions, num_rows, planner_config;
  std::uint64_t unused_068, zero_ptr_0b8, zero_ptr_130;
  std::uint32_t zero_0c0, zero_140;
};

template <typename T>
T* Pointer(const LaunchPlan& plan, std::size_t offset) {
  return reinterpret_cast<T*>(static_cast<std::uintptr_t>(GetKernarg<std::uint64_t>(plan, offset)));
}

#define JAX_MLA_KERNARG_PTR(field, T) Pointer<T>(plan, offsetof(PersistentKernargs, field))
#define JAX_MLA_KERNARG(field, T) GetKernarg<T>(plan, offsetof(PersistentKernargs, field))

Args ReadArgs(const LaunchPlan& plan) {
  Args a;
  a.o_acc = JAX_MLA_KERNARG_PTR(o_acc, float);
  a.out = JAX_MLA_KERNARG_PTR(out, std::uint16_t);
  a.lse_acc = JAX_MLA_KERNARG_PTR(lse_acc, float);
  a.lse = JAX_MLA_KERNARG_PTR(lse, float);
  a.q = JAX_MLA_KERNARG_PTR(q, const std::uint8_t);
  a.kv = JAX_MLA_KERNARG_PTR(kv, const std::uint8_t);
  a.kv_indptr = JAX_MLA_KERNARG_PTR(kv_indptr, const std::int32_t);
  a.kv_indices = JAX_MLA_KERNARG_PTR(kv_indices, const std::int32_t);
  a.desc = JAX_MLA_KERNARG_PTR(desc, std::int32_t);
  a.cnt = JAX_MLA_KERNARG_PTR(cnt, std::uint32_t);
  a.qo_indptr = JAX_MLA_KERNARG_PTR(qo_indptr, const std::int32_t);
  a.split_indptr = JAX_MLA_KERNARG_PTR(split_indptr, const std::int32_t);
  a.q_rope = JAX_MLA_KERNARG_PTR(q_rope, const std::uint16_t);
  a.kv_rope = JAX_MLA_KERNARG_PTR(kv_rope, const std::uint16_t);
  a.sink = JAX_MLA_KERNARG_PTR(sink, const float);
  a.softmax_scale = JAX_MLA_KERNARG(softmax_scale, float);
  a.num_heads = JAX_MLA_KERNARG(num_heads, std::uint32_t);
  a.one_090 = JAX_MLA_KERNARG(one_090, std::uint32_t);
  a.bf16_output = JAX_MLA_KERNARG(bf16_output, std::uint32_t);
  a.num_partitions = JAX_MLA_KERNARG(num_partitions, std::uint32_t);
  a.num_rows = JAX_MLA_KERNARG(num_rows, std::uint32_t);
  a.planner_config = JAX_MLA_KERNARG(planner_config, std::uint32_t);
  a.unused_068 = JAX_MLA_KERNARG(unused_068, std::uint64_t);
  a.zero_ptr_0b8 = JAX_MLA_KERNARG(zero_ptr_0b8, std::uint64_t);
  a.zero_ptr_130 = JAX_MLA_KERNARG(zero_ptr_130, std::uint64_t);
  a.zero_0c0 = JAX_MLA_KERNARG(zero_0c0, std::uint32_t);
  a.zero_140 = JAX_MLA_KERNARG(zero_140, std::uint32_t);
  return a;
}

#undef JAX_MLA_KERNARG_PTR
#undef JAX_MLA_KERNARG

Status Invalid(const std::string& message) { return Status::InvalidArgument(kWho + message); }

// The scalars the kernel hard-wires or requires; a wrong slot shows up here.
Status CheckPlan(const LaunchPlan& plan, const Args& a, const PersistentHostBounds& b) {
  if (plan.kernel != KernelId::kPersistentNmPs) return Invalid("the plan is not for the nm_ps kernel");
  if (a.num_heads != kPersistentHeads || a.one_090 != 1 || a.bf16_output != 1) {
    return Invalid("kernarg scalars at 0x080/0x090/0x0f0 must be 128/1/1, got " +
                   std::to_string(a.num_heads) + "/" + std::to_string(a.one_090) + "/" +
                   std::to_string(a.bf16_output));
  }
  if (a.softmax_scale != static_cast<float>(1.0 / std::sqrt(512.0))) {
    return Invalid("kernarg 0x070 must hold 1/sqrt(512), got " + std::to_string(a.softmax_scale));
  }
  if (a.unused_068 || a.zero_ptr_0b8 || a.zero_ptr_130 || a.zero_0c0 || a.zero_140) {
    return Invalid("kernarg slots 0x068/0x0b8/0x0c0/0x130/0x140 must be zero");
  }
  if (a.num_partitions < 1 || a.num_partitions > kPersistentMaxPartitions ||
      plan.grid.x != 2 * a.num_partitions || plan.grid.y != 1 || plan.grid.z != 1) {
    return Invalid("grid must be (2P, 1, 1) with P in [1, 1024], got P=" +
                   std::to_string(a.num_partitions) + " grid.x=" + std::to_string(plan.grid.x));
  }
  if (a.num_rows > kPersistentMaxRows) return Invalid("N > 32768: " + std::to_string(a.num_rows));
  const struct { const void* p; const char* name; } required[] = {
      {a.o_acc, "o_acc"}, {a.out, "out"}, {a.lse_acc, "lse_acc"}, {a.q, "q"}, {a.kv, "kv"},
      {a.kv_indptr, "kv_indptr"}, {a.kv_indices, "kv_indices"}, {a.desc, "desc"}, {a.cnt, "cnt"},
      {a.qo_indptr, "qo_indptr"}, {a.split_indptr, "split_indptr"}, {a.q_rope, "q_rope"},
      {a.kv_rope, "kv_rope"}, {a.sink, "sink"}};
  for (const auto& r : required) {
    if (r.p == nullptr) return Invalid(std::string("kernarg pointer ") + r.name + " is null");
  }
  if (a.qo_indptr != a.split_indptr) return Invalid("qo_indptr and split_indptr must be the arange buffer");

  const std::uint64_t n = a.num_rows, p = a.num_partitions;
  const struct { std::uint64_t have, need; const char* what; } extents[] = {
      {b.q_rows, n, "q/q_rope rows"}, {b.out_rows, n, "out rows"},
      {b.kv_indptr_len, n + 1, "kv_indptr entries"}, {b.arange_len, n + 1, "arange entries"},
      {b.acc_slots, 2 * p, "o_acc/lse_acc slots (2P)"}, {b.desc_rows, p, "desc rows (P)"},
      {b.cnt_len, 2 * n, "cnt entries"}, {a.lse ? b.lse_rows : n, n, "lse rows"}};
  for (const auto& e : extents) {
    if (e.have < e.need) {
      return Invalid(std::string(e.what) + ": the buffer has " + std::to_string(e.have) +
                     ", the plan needs " + std::to_string(e.need));
    }
  }
  return Status::Ok();
}

// The in-kernel counters must be zero on entry; a previous call that failed midway leaves them
// set, and the real kernel would then silently merge garbage.
Status CheckCountersZero(const Args& a, const PersistentHostBounds& b) {
  for (std::uint64_t i = 0; i < b.cnt_len; ++i) {
    if (a.cnt[i] != 0) {
      return Status::FailedPrecondition(
          std::string(kWho) + "the workspace's arrival counters are not zero (cnt[" +
          std::to_string(i) + "] = " + std::to_string(a.cnt[i]) +
          "): a previous call did not complete. Call jax_mla.reset_workspace(workspace) before "
          "reusing it.");
    }
  }
  return Status::Ok();
}

Status CheckIndices(const Args& a, const PersistentHostBounds& b) {
  const std::uint32_t n = a.num_rows;
  for (std::uint32_t r = 0; r <= n; ++r) {
    if (a.qo_indptr[r] != static_cast<std::int32_t>(r)) {
      return Invalid("arange[" + std::to_string(r) + "] = " + std::to_string(a.qo_indptr[r]) +
                     ", expected " + std::to_string(r) + " (make_workspace builds 0, 1, 2, ...)");
    }
  }
  if (a.kv_indptr[0] < 0) return Invalid("kv_indptr[0] = " + std::to_string(a.kv_indptr[0]) + " < 0");
  for (std::uint32_t r = 0; r < n; ++r) {
    if (a.kv_indptr[r + 1] < a.kv_indptr[r]) {
      return Invalid("kv_indptr decreases at row " + std::to_string(r) + ": " +
                     std::to_string(a.kv_indptr[r]) + " > " + std::to_string(a.kv_indptr[r + 1]));
    }
  }
  if (static_cast<std::uint64_t>(a.kv_indptr[n]) > b.kv_indices_len) {
    return Invalid("kv_indptr[" + std::to_string(n) + "] = " + std::to_string(a.kv_indptr[n]) +
                   " exceeds the " + std::to_string(b.kv_indices_len) + " entries of kv_indices");
  }
  for (std::uint32_t r = 0; r < n; ++r) {
    for (std::int64_t j = a.kv_indptr[r]; j < a.kv_indptr[r + 1]; ++j) {
      const std::int64_t v = a.kv_indices[j];
      if (v < 0 || static_cast<std::uint64_t>(v) >= b.kv_rows) {
        return Invalid("kv_indices[" + std::to_string(j) + "] = " + std::to_string(v) + " (row " +
                       std::to_string(r) + ") is outside the " + std::to_string(b.kv_rows) +
                       " rows of kv");
      }
    }
  }
  return Status::Ok();
}

void FillUnwrittenWithNan(const Args& a) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (std::uint32_t r = 0; r < a.num_rows; ++r) {
    if (a.kv_indptr[r + 1] != a.kv_indptr[r]) continue;
    std::uint16_t* out = a.out + std::size_t{r} * kPersistentHeads * kHeadDim;
    std::fill(out, out + std::size_t{kPersistentHeads} * kHeadDim, host::kBf16QuietNan);
    if (a.lse) std::fill(a.lse + std::size_t{r} * kPersistentHeads, a.lse + std::size_t{r + 1} * kPersistentHeads, nan);
  }
}

// Tiles end to end: row r owns global tiles [tile_start[r], tile_start[r + 1]).
struct Schedule {
  std::vector<std::int64_t> tile_start;
  std::int64_t total_tiles = 0;
  std::int64_t tiles_per_partition = 0;  // C = ceil(T / P)

  std::int64_t Tiles(std::int64_t r) const { return tile_start[r + 1] - tile_start[r]; }
  std::int64_t PartitionOf(std::int64_t tile) const { return tile / tiles_per_partition; }
  // Slot of row r's piece in partition p: 0 if the row holds p's first tile, else 1.
  int SlotIn(std::int64_t r, std::int64_t p) const {
    return tile_start[r] <= p * tiles_per_partition ? 0 : 1;
  }
};

Schedule MakeSchedule(const Args& a) {
  Schedule s;
  s.tile_start.resize(a.num_rows + 1);
  s.tile_start[0] = 0;
  for (std::uint32_t r = 0; r < a.num_rows; ++r) {
    const std::int64_t k = a.kv_indptr[r + 1] - a.kv_indptr[r];
    s.tile_start[r + 1] = s.tile_start[r] + (k + kTileTokens - 1) / kTileTokens;
  }
  s.total_tiles = s.tile_start[a.num_rows];
  s.tiles_per_partition = std::max<std::int64_t>(
      1, (s.total_tiles + a.num_partitions - 1) / a.num_partitions);
  return s;
}

class Workgroups {
 public:
  Workgroups(const Args& a, const Schedule& s) : a_(a), s_(s), call_id_(host::NewCallId()) {}

  // Partition p: both of its workgroups (2p: heads 0-63, 2p + 1: heads 64-127) at once. They
  // walk the same tiles, so on the host they run as one 128-row block that dequantizes each KV
  // row once; each half then writes, arrives and merges exactly as its workgroup would.
  void Run(std::int64_t p, host::PieceScratch& scratch) const {
    const std::int64_t begin = std::min(p * s_.tiles_per_partition, s_.total_tiles);
    const std::int64_t end = std::min(begin + s_.tiles_per_partition, s_.total_tiles);
    std::int32_t desc[8] = {static_cast<std::int32_t>(begin), static_cast<std::int32_t>(end), -1, -1, -1, -1, 0, 0};
    if (begin < end) {
      // The row holding tile `begin`: the last row whose first tile is <= begin.
      std::int64_t r = std::upper_bound(s_.tile_start.begin(), s_.tile_start.end(), begin) -
                       s_.tile_start.begin() - 1;
      desc[2] = static_cast<std::int32_t>(r);
      for (; r < a_.num_rows && s_.tile_start[r] < end; ++r) {
        if (s_.Tiles(r) == 0) continue;
        desc[3] = static_cast<std::int32_t>(r);
        const std::int64_t first = std::max(s_.tile_start[r], begin);
        const std::int64_t last = std::min(s_.tile_start[r + 1], end);
        Attend(r, first - s_.tile_start[r], last - s_.tile_start[r], scratch);
        const bool whole = s_.tile_start[r] >= begin && s_.tile_start[r + 1] <= end;
        for (int half = 0; half < 2; ++half) {
          if (whole) {
            FinishWholeRow(r, half, scratch);
          } else {
            const int slot = s_.SlotIn(r, p);
            desc[4 + slot] = static_cast<std::int32_t>(r);
            WritePieceAndArrive(r, half, p, slot, scratch);
          }
        }
      }
    }
    desc[6] = (desc[4] >= 0) + (desc[5] >= 0);
    std::copy(desc, desc + 8, a_.desc + p * 8);
  }

 private:
  static constexpr std::size_t kHeads = kPersistentHeads;

  void Attend(std::int64_t r, std::int64_t tile_begin, std::int64_t tile_end,
              host::PieceScratch& scratch) const {
    const std::int64_t k = a_.kv_indptr[r + 1] - a_.kv_indptr[r];
    const std::int64_t token_begin = tile_begin * kTileTokens;
    const std::int64_t token_end = std::min(tile_end * kTileTokens, k);
    const std::size_t q_row = static_cast<std::size_t>(a_.qo_indptr[r]);
    host::PieceInputs in;
    in.q = a_.q + q_row * kHeads * kRowBytes;
    in.q_rope = a_.q_rope + q_row * kHeads * kRopeDim;
    in.num_heads = static_cast<int>(kHeads);
    in.kv = a_.kv;
    in.kv_rope = a_.kv_rope;
    in.kv_ids = a_.kv_indices + a_.kv_indptr[r] + token_begin;
    in.num_tokens = token_end - token_begin;
    in.softmax_scale = a_.softmax_scale;
    in.call_id = call_id_;
    host::AttendPiece(in, scratch);
  }

  void WriteRow(std::int64_t r, int half, const float* const* partials_by_head_piece,
                const double* lse2_by_head_piece, int pieces) const {
    for (int h = 0; h < kHeadsPerWorkgroup; ++h) {
      const std::size_t head = static_cast<std::size_t>(half) * kHeadsPerWorkgroup + h;
      std::uint16_t* out = a_.out + (static_cast<std::size_t>(r) * kHeads + head) * kHeadDim;
      float* lse = a_.lse ? a_.lse + static_cast<std::size_t>(r) * kHeads + head : nullptr;
      host::MergeHead(partials_by_head_piece + static_cast<std::size_t>(h) * pieces,
                      lse2_by_head_piece + static_cast<std::size_t>(h) * pieces, pieces, a_.sink[head], out, lse);
    }
  }

  void FinishWholeRow(std::int64_t r, int half, host::PieceScratch& scratch) const {
    const int head0 = half * kHeadsPerWorkgroup;
    const float* partials[kHeadsPerWorkgroup];
    for (int h = 0; h < kHeadsPerWorkgroup; ++h) partials[h] = scratch.block.Acc(head0 + h);
    WriteRow(r, half, partials, scratch.lse2.data() + head0, 1);
  }

  void WritePieceAndArrive(std::int64_t r, int half, std::int64_t p, int slot,
                           host::PieceScratch& scratch) const {
    const std::size_t acc_slot = static_cast<std::size_t>(2 * p + slot);
    for (int h = 0; h < kHeadsPerWorkgroup; ++h) {
      const std::size_t head = static_cast<std::size_t>(half) * kHeadsPerWorkgroup + h;
      std::copy_n(scratch.block.Acc(static_cast<int>(head)), kHeadDim,
                  a_.o_acc + (acc_slot * kHeads + head) * kHeadDim);
      a_.lse_acc[acc_slot * kHeads + head] = static_cast<float>(scratch.lse2[head]);
    }
    const std::int64_t p_first = s_.PartitionOf(s_.tile_start[r]);
    const std::int64_t p_last = s_.PartitionOf(s_.tile_start[r + 1] - 1);
    const std::uint32_t pieces = static_cast<std::uint32_t>(p_last - p_first + 1);
    std::uint32_t* counter = a_.cnt + 2 * r + half;
    // Release our partial, acquire everyone else's: the last arrival sees all pieces.
    if (__atomic_add_fetch(counter, 1u, __ATOMIC_ACQ_REL) != pieces) return;
    std::vector<const float*> partials(std::size_t{kHeadsPerWorkgroup} * pieces);
    std::vector<double> lse2(partials.size());
    for (std::uint32_t i = 0; i < pieces; ++i) {
      const std::int64_t q = p_first + i;
      const std::size_t from = static_cast<std::size_t>(2 * q + s_.SlotIn(r, q));
      for (int h = 0; h < kHeadsPerWorkgroup; ++h) {
        const std::size_t head = static_cast<std::size_t>(half) * kHeadsPerWorkgroup + h;
        partials[static_cast<std::size_t>(h) * pieces + i] = a_.o_acc + (from * kHeads + head) * kHeadDim;
        lse2[static_cast<std::size_t>(h) * pieces + i] = a_.lse_acc[from * kHeads + head];
      }
    }
    WriteRow(r, half, partials.data(), lse2.data(), static_cast<int>(pieces));
    __atomic_store_n(counter, 0u, __ATOMIC_RELEASE);  // zero at rest for the next call
  }

  const Args& a_;
  const Schedule& s_;
  const std::uint64_t call_id_;
};

}  // namespace

Status ExecutePersistentOnHost(const LaunchPlan& plan, const PersistentHostBounds& bounds,
                               const PersistentHostOptions& options) {
  const Args a = ReadArgs(plan);
  JAX_MLA_RETURN_IF_ERROR(CheckPlan(plan, a, bounds));
  JAX_MLA_RETURN_IF_ERROR(CheckCountersZero(a, bounds));
  JAX_MLA_RETURN_IF_ERROR(CheckIndices(a, bounds));
  if (options.fill_unwritten_nan) FillUnwrittenWithNan(a);

  const Schedule schedule = MakeSchedule(a);
  const Workgroups workgroups(a, schedule);
  // Partitions with no tiles only write desc: not worth a thread.
  const unsigned max_threads = schedule.total_tiles == 0 ? 1 : options.num_threads;
  const bool done = host::RunWorkgroups<host::PieceScratch>(
      std::int64_t{a.num_partitions}, max_threads,
      [&](std::int64_t partition, host::PieceScratch& scratch) {
        workgroups.Run(partition, scratch);
      });
  if (!done) {
    return Status::Internal(std::string(kWho) +
                            "a worker failed (out of memory?); the call did not complete and may "
                            "leave the workspace counters set: call jax_mla.reset_workspace");
  }
  return Status::Ok();
}

}  // namespace jax_mla
