// The 336-byte kernel argument block of the persistent kernel (nm_ps), as KERNELS.md section 4
// lays it out. Every listed offset is pinned by a static_assert; every other byte is a reserved
// field that value-initialisation leaves zero, which the kernel requires.
#ifndef JAX_MLA_PERSISTENT_KERNARGS_H_
#define JAX_MLA_PERSISTENT_KERNARGS_H_

#include <cstddef>
#include <cstdint>

#include "common/launch_plan.h"

namespace jax_mla {

struct PersistentKernargs {
  std::uint64_t o_acc;                 // 0x000 fp32 partials [2P, 128, 512]
  std::uint64_t out;                   // 0x008 bf16 [N, 128, 512]
  std::uint64_t lse_acc;               // 0x010 fp32 partial LSE [2P, 128], log2, no sink
  std::uint64_t lse;                   // 0x018 fp32 [N, 128] natural log incl. sink, or 0
  std::uint64_t q;                     // 0x020 packed q rows
  std::uint8_t reserved_028[8];
  std::uint64_t kv;                    // 0x030 packed kv rows
  std::uint8_t reserved_038[8];
  std::uint64_t kv_indptr;             // 0x040 i32 [N + 1]
  std::uint8_t reserved_048[8];
  std::uint64_t kv_indices;            // 0x050 i32 (kv_page_indices, page size 1)
  std::uint8_t reserved_058[8];
  std::uint64_t desc;                  // 0x060 i32 [P, 8], written by the kernel
  std::uint64_t unused_068;            // 0x068 0
  float softmax_scale;                 // 0x070 1/sqrt(512)
  std::uint8_t reserved_074[12];
  std::uint32_t num_heads;             // 0x080 128
  std::uint8_t reserved_084[12];
  std::uint32_t one_090;               // 0x090 1
  std::uint8_t reserved_094[4];
  std::uint64_t cnt;                   // 0x098 u32 arrival counters, zero at rest
  std::uint32_t num_partitions;        // 0x0a0 P
  std::uint32_t num_rows;              // 0x0a4 N
  std::uint8_t reserved_0a8[8];
  std::uint32_t planner_config;        // 0x0b0 F | (MT << 8)
  std::uint8_t reserved_0b4[4];
  std::uint64_t zero_ptr_0b8;          // 0x0b8 0
  std::uint32_t zero_0c0;              // 0x0c0 0
  std::uint8_t reserved_0c4[12];
  std::uint64_t qo_indptr;             // 0x0d0 the arange buffer
  std::uint8_t reserved_0d8[8];
  std::uint64_t split_indptr;          // 0x0e0 the same arange buffer
  std::uint8_t reserved_0e8[8];
  std::uint32_t bf16_output;           // 0x0f0 1
  std::uint8_t reserved_0f4[12];
  std::uint64_t q_rope;                // 0x100 bf16 [N, 128, 64]
  std::uint8_t reserved_108[8];
  std::uint64_t kv_rope;               // 0x110 bf16 [rows, 64]
  std::uint8_t reserved_118[8];
  std::uint64_t sink;                  // 0x120 f32 [128], never null
  std::uint8_t reserved_128[8];
  std::uint64_t zero_ptr_130;          // 0x130 0
  std::uint8_t reserved_138[8];
  std::uint32_t zero_140;              // 0x140 0
  std::uint8_t reserved_144[12];
};

static_assert(sizeof(PersistentKernargs) == kKernargBytes, "nm_ps kernargs are 336 bytes");
static_assert(offsetof(PersistentKernargs, o_acc) == 0x000);
static_assert(offsetof(PersistentKernargs, out) == 0x008);
static_assert(offsetof(PersistentKernargs, lse_acc) == 0x010);
static_assert(offsetof(PersistentKernargs, lse) == 0x018);
static_assert(offsetof(PersistentKernargs, q) == 0x020);
static_assert(offsetof(PersistentKernargs, kv) == 0x030);
static_assert(offsetof(PersistentKernargs, kv_indptr) == 0x040);
static_assert(offsetof(PersistentKernargs, kv_indices) == 0x050);
static_assert(offsetof(PersistentKernargs, desc) == 0x060);
static_assert(offsetof(PersistentKernargs, unused_068) == 0x068);
static_assert(offsetof(PersistentKernargs, softmax_scale) == 0x070);
static_assert(offsetof(PersistentKernargs, num_heads) == 0x080);
static_assert(offsetof(PersistentKernargs, one_090) == 0x090);
static_assert(offsetof(PersistentKernargs, cnt) == 0x098);
static_assert(offsetof(PersistentKernargs, num_partitions) == 0x0a0);
static_assert(offsetof(PersistentKernargs, num_rows) == 0x0a4);
static_assert(offsetof(PersistentKernargs, planner_config) == 0x0b0);
static_assert(offsetof(PersistentKernargs, zero_ptr_0b8) == 0x0b8);
static_assert(offsetof(PersistentKernargs, zero_0c0) == 0x0c0);
static_assert(offsetof(PersistentKernargs, qo_indptr) == 0x0d0);
static_assert(offsetof(PersistentKernargs, split_indptr) == 0x0e0);
static_assert(offsetof(PersistentKernargs, bf16_output) == 0x0f0);
static_assert(offsetof(PersistentKernargs, q_rope) == 0x100);
static_assert(offsetof(PersistentKernargs, kv_rope) == 0x110);
static_assert(offsetof(PersistentKernargs, sink) == 0x120);
static_assert(offsetof(PersistentKernargs, zero_ptr_130) == 0x130);
static_assert(offsetof(PersistentKernargs, zero_140) == 0x140);

}  // namespace jax_mla

#endif  // JAX_MLA_PERSISTENT_KERNARGS_H_
