// What a plan produces for either kernel and either launcher (HIP or the host executor):
// which kernel, its 336 kernarg bytes, and the launch geometry. Pure data, no HIP or XLA types.
#ifndef JAX_MLA_COMMON_LAUNCH_PLAN_H_
#define JAX_MLA_COMMON_LAUNCH_PLAN_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace jax_mla {

inline constexpr std::size_t kKernargBytes = 336;
inline constexpr std::uint32_t kBlockThreads = 256;

enum class KernelId : int {
  kSplitNm = 0,         // mla_a8w8_qh64_qseqlen1_gqaratio64_nm (split + merge)
  kPersistentNmPs = 1,  // mla_a8w8_qh64_qseqlen1_gqaratio64_nm_ps (one launch, in-kernel merge)
};

// Manifest ids (hsa/manifest.json "id") and ELF symbols, in KernelId order.
inline const char* KernelManifestId(KernelId k) {
  return k == KernelId::kSplitNm ? "mla_v4_nm" : "mla_v4_nm_ps";
}
inline const char* KernelSymbol(KernelId k) {
  return k == KernelId::kSplitNm ? "_ZN5aiter36mla_a8w8_qh64_qseqlen1_gqaratio64_nmE"
                                 : "_ZN5aiter39mla_a8w8_qh64_qseqlen1_gqaratio64_nm_psE";
}

struct Dim3 {
  std::uint32_t x = 1, y = 1, z = 1;
};

struct LaunchPlan {
  KernelId kernel = KernelId::kSplitNm;
  std::array<std::uint8_t, kKernargBytes> kernargs{};  // exactly what the kernel reads
  Dim3 grid;
  Dim3 block{kBlockThreads, 1, 1};
  std::uint32_t shared_mem_bytes = 0;  // no dynamic LDS for either kernel
};

// Typed reads and writes of kernarg bytes at a byte offset; used by the plans (write) and the
// host executors (read back), so both sides go through the same bytes.
template <typename T>
inline void PutKernarg(LaunchPlan& plan, std::size_t offset, T value) {
  static_assert(sizeof(T) <= 8, "kernarg values are 4 or 8 bytes");
  std::memcpy(plan.kernargs.data() + offset, &value, sizeof(T));
}
template <typename T>
inline T GetKernarg(const LaunchPlan& plan, std::size_t offset) {
  T value;
  std::memcpy(&value, plan.kernargs.data() + offset, sizeof(T));
  return value;
}

}  // namespace jax_mla

#endif  // JAX_MLA_COMMON_LAUNCH_PLAN_H_
