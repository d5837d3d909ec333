#include "host/row_format.h"

#include <array>
#include <cmath>
#include <limits>

#include "host/bf16.h"

namespace jax_mla::host {
namespace {

struct ByteTables {
  std::array<float, 256> e4m3fn;
  std::array<float, 256> e8m0;
};

// Built once: a table lookup per byte is what makes dequantization cheap.
const ByteTables& Tables() {
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

}  // namespace

float DecodeE4m3fn(std::uint8_t byte) {
  const int sign = byte >> 7, exponent = (byte >> 3) & 0xF, mantissa = byte & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                        : std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
  return sign ? -magnitude : magnitude;
}

void DequantizeRow(const std::uint8_t* packed, const std::uint16_t* rope, float* out) {
  const ByteTables& t = Tables();
  for (int tile = 0; tile < kScaleTiles; ++tile) {
    const float scale = t.e8m0[packed[kFirstScaleByte + 2 * tile]];
    const std::uint8_t* src = packed + kScaleTileDim * tile;
    float* dst = out + kScaleTileDim * tile;
    for (int i = 0; i < kScaleTileDim; ++i) dst[i] = t.e4m3fn[src[i]] * scale;
  }
  for (int i = 0; i < kRopeDim; ++i) out[kNopeDim + i] = Bf16ToFloat(rope[i]);
}

}  // namespace jax_mla::host
