// The nm (split-plus-merge) kernel's 336-byte kernel argument block, KERNELS.md section 3:
// 21 slots of 16 bytes, each value at the start of its slot and the rest of the slot zero.
// The struct exists so the table is machine-checked: every offset below is static_assert'ed.
#ifndef JAX_MLA_SPLIT_KERNARGS_H_
#define JAX_MLA_SPLIT_KERNARGS_H_

#include <cstddef>
#include <cstdint>

#include "common/launch_plan.h"

namespace jax_mla {

// A 16-byte slot holding an 8-byte pointer or a 4-byte scalar at its start.
struct PtrSlot {
  std::uint64_t value;
  std::uint64_t zero;
};
struct U32Slot {
  std::uint32_t value;
  std::uint32_t zero[3];
};
struct F32Slot {
  float value;
  std::uint32_t zero[3];
};

struct SplitNmKernargs {
  PtrSlot out;                // 0: fp32 partials, or the bf16 final output when S == 1
  PtrSlot partial_lse;        // 1: fp32 partial LSE (0 when S == 1)
  PtrSlot q;                  // 2: q packed rows
  PtrSlot kv;                 // 3: kv packed rows
  PtrSlot kv_indptr;          // 4
  PtrSlot kv_page_indices;    // 5
  PtrSlot kv_last_page_lens;  // 6: unread with page size 1; 0
  F32Slot softmax_scale;      // 7: 1/sqrt(512), hard-wired by the kernel anyway
  U32Slot gqa;                // 8
  U32Slot num_kv_splits;      // 9
  U32Slot total_kv;           // 10: 0 on gfx950
  U32Slot stride_page;        // 11: 0 on gfx950
  U32Slot log2_page_size;     // 12: 0 (page size 1)
  PtrSlot qo_indptr;          // 13
  PtrSlot split_indptr;       // 14
  U32Slot bf16_direct;        // 15: 1 iff S == 1
  PtrSlot q_rope;             // 16
  PtrSlot kv_rope;            // 17
  PtrSlot sink;               // 18: never null
  PtrSlot valid_split_count;  // 19: or 0
  U32Slot write_valid_count;  // 20: 1 iff S > 1
};

static_assert(sizeof(PtrSlot) == 16 && sizeof(U32Slot) == 16 && sizeof(F32Slot) == 16);
static_assert(sizeof(SplitNmKernargs) == kKernargBytes, "KERNELS.md: 336 bytes");
static_assert(offsetof(SplitNmKernargs, out) == 0x000);
static_assert(offsetof(SplitNmKernargs, partial_lse) == 0x010);
static_assert(offsetof(SplitNmKernargs, q) == 0x020);
static_assert(offsetof(SplitNmKernargs, kv) == 0x030);
static_assert(offsetof(SplitNmKernargs, kv_indptr) == 0x040);
static_assert(offsetof(SplitNmKernargs, kv_page_indices) == 0x050);
static_assert(offsetof(SplitNmKernargs, kv_last_page_lens) == 0x060);
static_assert(offsetof(SplitNmKernargs, softmax_scale) == 0x070);
static_assert(offsetof(SplitNmKernargs, gqa) == 0x080);
static_assert(offsetof(SplitNmKernargs, num_kv_splits) == 0x090);
static_assert(offsetof(SplitNmKernargs, total_kv) == 0x0a0);
static_assert(offsetof(SplitNmKernargs, stride_page) == 0x0b0);
static_assert(offsetof(SplitNmKernargs, log2_page_size) == 0x0c0);
static_assert(offsetof(SplitNmKernargs, qo_indptr) == 0x0d0);
static_assert(offsetof(SplitNmKernargs, split_indptr) == 0x0e0);
static_assert(offsetof(SplitNmKernargs, bf16_direct) == 0x0f0);
static_assert(offsetof(SplitNmKernargs, q_rope) == 0x100);
static_assert(offsetof(SplitNmKernargs, kv_rope) == 0x110);
static_assert(offsetof(SplitNmKernargs, sink) == 0x120);
static_assert(offsetof(SplitNmKernargs, valid_split_count) == 0x130);
static_assert(offsetof(SplitNmKernargs, write_valid_count) == 0x140);

// Byte offsets for PutKernarg/GetKernarg, taken from the struct so they cannot drift from it.
namespace split_slot {
inline constexpr std::size_t kOut = offsetof(SplitNmKernargs, out);
inline constexpr std::size_t kPartialLse = offsetof(SplitNmKernargs, partial_lse);
inline constexpr std::size_t kQ = offsetof(SplitNmKernargs, q);
inline constexpr std::size_t kKv = offsetof(SplitNmKernargs, kv);
inline constexpr std::size_t kKvIndptr = offsetof(SplitNmKernargs, kv_indptr);
inline constexpr std::size_t kKvPageIndices = offsetof(SplitNmKernargs, kv_page_indices);
inline constexpr std::size_t kKvLastPageLens = offsetof(SplitNmKernargs, kv_last_page_lens);
inline constexpr std::size_t kSoftmaxScale = offsetof(SplitNmKernargs, softmax_scale);
inline constexpr std::size_t kGqa = offsetof(SplitNmKernargs, gqa);
inline constexpr std::size_t kNumKvSplits = offsetof(SplitNmKernargs, num_kv_splits);
inline constexpr std::size_t kTotalKv = offsetof(SplitNmKernargs, total_kv);
inline constexpr std::size_t kStridePage = offsetof(SplitNmKernargs, stride_page);
inline constexpr std::size_t kLog2PageSize = offsetof(SplitNmKernargs, log2_page_size);
inline constexpr std::size_t kQoIndptr = offsetof(SplitNmKernargs, qo_indptr);
inline constexpr std::size_t kSplitIndptr = offsetof(SplitNmKernargs, split_indptr);
inline constexpr std::size_t kBf16Direct = offsetof(SplitNmKernargs, bf16_direct);
inline constexpr std::size_t kQRope = offsetof(SplitNmKernargs, q_rope);
inline constexpr std::size_t kKvRope = offsetof(SplitNmKernargs, kv_rope);
inline constexpr std::size_t kSink = offsetof(SplitNmKernargs, sink);
inline constexpr std::size_t kValidSplitCount = offsetof(SplitNmKernargs, valid_split_count);
inline constexpr std::size_t kWriteValidCount = offsetof(SplitNmKernargs, write_valid_count);
}  // namespace split_slot

}  // namespace jax_mla

#endif  // JAX_MLA_SPLIT_KERNARGS_H_
