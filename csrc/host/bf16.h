// bf16 <-> float for the host executors: q/kv RoPE values in, bf16 outputs out.
#ifndef JAX_MLA_HOST_BF16_H_
#define JAX_MLA_HOST_BF16_H_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace jax_mla::host {

inline constexpr std::uint16_t kBf16QuietNan = 0x7FC0;

inline float Bf16ToFloat(std::uint16_t bits) {
  const std::uint32_t widened = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &widened, sizeof(f));
  return f;
}

// Round to nearest even; NaN stays a (quiet) NaN with its sign, as XLA's convert does.
inline std::uint16_t FloatToBf16(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if (std::isnan(f)) return static_cast<std::uint16_t>((bits >> 16) | 0x0040);
  const std::uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

}  // namespace jax_mla::host

#endif  // JAX_MLA_HOST_BF16_H_
