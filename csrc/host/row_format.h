// The packed DeepSeek-V4 row both kernels read (KERNELS.md section 2), and its dequantization.
// A row is 512 bytes: 448 fp8 e4m3fn NoPE values in 7 tiles of 64, then each tile's e8m0 scale
// at byte 448 + 2t (value * 2^(scale - 127); 0xFF is NaN). The second copy of each scale
// (byte 449 + 2t) and the padding (bytes 462..511) are never read. The 64 RoPE values are bf16
// in a separate array.
#ifndef JAX_MLA_HOST_ROW_FORMAT_H_
#define JAX_MLA_HOST_ROW_FORMAT_H_

#include <cstdint>
#include <cstring>

namespace jax_mla::host {

inline constexpr int kHeadDim = 512;   // dequantized row: 448 NoPE + 64 RoPE
inline constexpr int kNopeDim = 448;
inline constexpr int kRopeDim = 64;
inline constexpr int kRowBytes = 512;  // packed row
inline constexpr int kScaleTileDim = 64;
inline constexpr int kScaleTiles = kNopeDim / kScaleTileDim;  // 7
inline constexpr int kFirstScaleByte = kNopeDim;

// OCP e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; no infinities; S.1111.111 is NaN.
float DecodeE4m3fn(std::uint8_t byte);

// e8m0: 2^(byte - 127); 0xFF is NaN. Built from the bits (inline: the tile kernels call it
// for every scale tile, 7 per KV row): byte as the exponent field, 0 the denormal 2^-127.
inline float DecodeE8m0(std::uint8_t byte) {
  const std::uint32_t b = byte;
  const std::uint32_t bits = b == 0 ? 0x00400000u : b == 0xFF ? 0x7FC00000u : b << 23;
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Writes the 512 floats of one row: packed[0..447] scaled by their tile's first scale copy,
// then the 64 bf16 RoPE values.
void DequantizeRow(const std::uint8_t* packed, const std::uint16_t* rope, float* out);

}  // namespace jax_mla::host

#endif  // JAX_MLA_HOST_ROW_FORMAT_H_
