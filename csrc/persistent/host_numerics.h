// Scalar conversions the host executors need: fp8 e4m3fn and e8m0 bytes to float (KERNELS.md
// section 2), bf16 to and from float. Plain functions and tables, no state beyond constants.
#ifndef JAX_MLA_PERSISTENT_HOST_NUMERICS_H_
#define JAX_MLA_PERSISTENT_HOST_NUMERICS_H_

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace jax_mla::host {

// OCP e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; no infinities; S.1111.111 is NaN.
inline float DecodeE4m3fn(std::uint8_t byte) {
  const int sign = byte >> 7, exponent = (byte >> 3) & 0xF, mantissa = byte & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                        : std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
  return sign ? -magnitude : magnitude;
}

// e8m0: 2^(b - 127); 0xFF is NaN.
inline float DecodeE8m0(std::uint8_t byte) {
  if (byte == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(byte) - 127);
}

struct ByteTables {
  std::array<float, 256> e4m3fn;
  std::array<float, 256> e8m0;
};

inline const ByteTables& Tables() {
  static const ByteTables tables = [] {
    ByteTables t;
    for (int b = 0; b < 256; ++b) {
      t.e4m3fn[b] = DecodeE4m3fn(static_cast<std::uint8_t>(b));
      t.e8m0[b] = DecodeE8m0(static_cast<std::uint8_t>(b));
    }
    return t;
  }();
  return tables;
}

inline float Bf16ToFloat(std::uint16_t bits) {
  const std::uint32_t widened = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &widened, sizeof(f));
  return f;
}

// Round to nearest even; NaN stays a (quiet) NaN.
inline std::uint16_t FloatToBf16(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if (std::isnan(f)) return static_cast<std::uint16_t>((bits >> 16) | 0x0040);
  const std::uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

inline constexpr std::uint16_t kBf16QuietNan = 0x7FC0;

}  // namespace jax_mla::host

#endif  // JAX_MLA_PERSISTENT_HOST_NUMERICS_H_
