#include "host/attention_tile.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <limits>
#include <new>
#include <string>

#include "host/cpu_info.h"
#include "host/tile_kernels.h"
#include "host/tile_math.h"

namespace jax_mla::host {
namespace {

constexpr int kRowAlign = 16;   // rows are padded to this in every kernel layout
constexpr int kTilePad = 16;    // zero KV rows after a tile's last, read by the score kernels

// Compiled twice (AVX2+FMA and baseline x86-64), picked at load time by the CPU.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define JAX_MLA_HOT_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define JAX_MLA_HOT_CLONES
#endif

// --- fp32 kernels ---------------------------------------------------------------------------
// Layouts: q_ is Q transposed, qt[d][padded_rows]; k_ is the dequantized tile [token][512];
// scores_ [token][padded_rows] holds the scores, then the probabilities.

// scores[j][r] = scale * sum_d k[j][d] * qt[d][r] for kMj tokens x 16 rows: 12 accumulators of
// 8 rows each, one broadcast K value per token and dim, Q read along the rows.
template <int kMj>
JAX_MLA_INLINE void ScoresFp32(const float* qt, int stride, const float* k, float scale,
                               float* scores) {
  V8 a[kMj], b[kMj];
#pragma GCC unroll 16
  for (int i = 0; i < kMj; ++i) a[i] = b[i] = Splat(0.0f);
  for (int d = 0; d < kHeadDim; ++d) {
    const V8 q0 = LoadV8(qt + static_cast<std::size_t>(d) * stride);
    const V8 q1 = LoadV8(qt + static_cast<std::size_t>(d) * stride + 8);
#pragma GCC unroll 16
    for (int i = 0; i < kMj; ++i) {
      const float kv = k[static_cast<std::size_t>(i) * kHeadDim + d];
      a[i] += kv * q0;
      b[i] += kv * q1;
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < kMj; ++i) {
    StoreV8(scores + static_cast<std::size_t>(i) * stride, a[i] * scale);
    StoreV8(scores + static_cast<std::size_t>(i) * stride + 8, b[i] * scale);
  }
}

// acc[r][d] = acc[r][d] * correction[r] + sum_j p[j][r] * v[j][d] for kMr rows x 16 dims, the
// tokens in order (acc read as 0 when fresh).
template <int kMr>
JAX_MLA_INLINE void AccumulateFp32(const float* p, int stride, const float* correction,
                                   const float* v, int n, float* acc, bool fresh) {
  V8 a[kMr], b[kMr];
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i) {
    const float c = correction[i];
    a[i] = fresh ? Splat(0.0f) : c * LoadV8(acc + static_cast<std::size_t>(i) * kHeadDim);
    b[i] = fresh ? Splat(0.0f) : c * LoadV8(acc + static_cast<std::size_t>(i) * kHeadDim + 8);
  }
  for (int j = 0; j < n; ++j) {
    const V8 v0 = LoadV8(v + static_cast<std::size_t>(j) * kHeadDim);
    const V8 v1 = LoadV8(v + static_cast<std::size_t>(j) * kHeadDim + 8);
    const float* pj = p + static_cast<std::size_t>(j) * stride;
#pragma GCC unroll 8
    for (int i = 0; i < kMr; ++i) {
      a[i] += pj[i] * v0;
      b[i] += pj[i] * v1;
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i) {
    StoreV8(acc + static_cast<std::size_t>(i) * kHeadDim, a[i]);
    StoreV8(acc + static_cast<std::size_t>(i) * kHeadDim + 8, b[i]);
  }
}

// r[k] = column k of the 8 x 8 block whose rows are r[0..7].
JAX_MLA_INLINE void Transpose8(V8 r[8]) {
  V8 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = __builtin_shufflevector(t[i], t[i + 2], 0, 1, 8, 9, 4, 5, 12, 13);
    r[i + 1] = __builtin_shufflevector(t[i], t[i + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    r[i + 2] = __builtin_shufflevector(t[i + 1], t[i + 3], 0, 1, 8, 9, 4, 5, 12, 13);
    r[i + 3] = __builtin_shufflevector(t[i + 1], t[i + 3], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  for (int j = 0; j < 4; ++j) {
    t[j] = __builtin_shufflevector(r[j], r[j + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    t[j + 4] = __builtin_shufflevector(r[j], r[j + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
  for (int j = 0; j < 8; ++j) r[j] = t[j];
}

// 8 rows at a time: dequantized row-major, then transposed 8 x 8 at a time (a store per element
// along the rows cost 70 us for 128 rows).
JAX_MLA_HOT_CLONES void LoadQueryFp32(const std::uint8_t* q, const std::uint16_t* q_rope,
                                      QueryBlock& b, const KvRows& kv,
                                      const std::int32_t* prefetch_ids, int prefetch_count) {
  float* qt = static_cast<float*>(b.q_);
  const int stride = b.padded_rows;
  RowPrefetch prefetch{kv.kv, kv.kv_rope, prefetch_ids, prefetch_count};
  const int per_group = (prefetch_count + stride / 8 - 1) / (stride / 8);
  alignas(64) float rows[8][kHeadDim];
  for (int r0 = 0; r0 < stride; r0 += 8) {
    prefetch.Next(per_group);
    for (int i = 0; i < 8; ++i) {
      const int r = r0 + i;
      if (r < b.num_rows) {
        DequantizeRowF32(q + static_cast<std::size_t>(kRowBytes) * r,
                         q_rope + static_cast<std::size_t>(kRopeDim) * r, rows[i]);
      } else {
        std::fill_n(rows[i], kHeadDim, 0.0f);
      }
    }
    for (int d0 = 0; d0 < kHeadDim; d0 += 8) {
      V8 block[8];
      for (int i = 0; i < 8; ++i) block[i] = LoadV8(rows[i] + d0);
      Transpose8(block);
      for (int k = 0; k < 8; ++k) StoreV8(qt + static_cast<std::size_t>(d0 + k) * stride + r0, block[k]);
    }
  }
}

JAX_MLA_HOT_CLONES void AttendTileFp32(const KvRows& kv, const std::int32_t* kv_ids, int n,
                                       float scale, QueryBlock& b, const std::int32_t* next_ids,
                                       int next_n) {
  constexpr int kMj = 6, kMr = 6;
  RowPrefetch prefetch{kv.kv, kv.kv_rope, next_ids, next_n};
  float* k = static_cast<float*>(b.k_);
  for (int j = 0; j < n; ++j) {
    const std::int64_t row = kv_ids[j];
    DequantizeRowF32(kv.kv + static_cast<std::size_t>(row) * kRowBytes,
                     kv.kv_rope + static_cast<std::size_t>(row) * kRopeDim,
                     k + static_cast<std::size_t>(kHeadDim) * j);
  }
  const int scored = (n + kMj - 1) / kMj * kMj;  // the score kernel reads up to here
  std::fill(k + static_cast<std::size_t>(kHeadDim) * n, k + static_cast<std::size_t>(kHeadDim) * scored,
            0.0f);
  const int stride = b.padded_rows;
  for (int r0 = 0; r0 < stride; r0 += 16) {
    for (int j0 = 0; j0 < scored; j0 += kMj) {
      ScoresFp32<kMj>(static_cast<const float*>(b.q_) + r0, stride,
                      k + static_cast<std::size_t>(kHeadDim) * j0, scale,
                      b.scores_ + static_cast<std::size_t>(j0) * stride + r0);
      prefetch.Next(1);
    }
  }
  SoftmaxStepN<false, V8, U8>(b.scores_, stride, stride, n, b.max, b.sum, b.weight_sum,
                              b.correction, nullptr);
  const bool fresh = b.acc_empty_;
  b.acc_empty_ = false;
  for (int d0 = 0; d0 < kHeadDim; d0 += 16) {
    prefetch.Next(3);
    for (int r0 = 0; r0 < b.num_rows; r0 += kMr) {
      const float* p = b.scores_ + r0;
      const float* c = b.correction + r0;
      float* acc = b.Acc(r0) + d0;
      switch (std::min(kMr, b.num_rows - r0)) {
        case 6: AccumulateFp32<6>(p, stride, c, k + d0, n, acc, fresh); break;
        case 5: AccumulateFp32<5>(p, stride, c, k + d0, n, acc, fresh); break;
        case 4: AccumulateFp32<4>(p, stride, c, k + d0, n, acc, fresh); break;
        case 3: AccumulateFp32<3>(p, stride, c, k + d0, n, acc, fresh); break;
        case 2: AccumulateFp32<2>(p, stride, c, k + d0, n, acc, fresh); break;
        default: AccumulateFp32<1>(p, stride, c, k + d0, n, acc, fresh); break;
      }
    }
  }
}


std::size_t RoundUp(std::size_t bytes) { return (bytes + 63) / 64 * 64; }

}  // namespace

TileKernels ActiveKernels() {
  static const bool bf16_supported = bf16::Supported();
  const char* forced = std::getenv("JAX_MLA_HOST_KERNELS");
  if (forced != nullptr && std::string(forced) == "fp32") return TileKernels::kFp32;
  return bf16_supported ? TileKernels::kAvx512Bf16 : TileKernels::kFp32;
}

const char* KernelsName(TileKernels kernels) {
  return kernels == TileKernels::kAvx512Bf16 ? "avx512-bf16" : "fp32";
}

int TileTokens() {
  static const int tokens = L2CacheBytes() >= (std::int64_t{1} << 20) ? 96 : 48;
  return tokens;
}

QueryBlock::QueryBlock() : kernels(ActiveKernels()), tile_tokens(TileTokens()) {
  const std::size_t tile_rows = static_cast<std::size_t>(tile_tokens) + kTilePad;
  const std::size_t acc_bytes = RoundUp(sizeof(float) * kMaxQueryRows * kHeadDim);
  const std::size_t q_bytes = RoundUp(sizeof(float) * kMaxQueryRows * kHeadDim);
  const std::size_t k_bytes = RoundUp(sizeof(float) * tile_rows * kHeadDim);
  const std::size_t scores_bytes = RoundUp(sizeof(float) * tile_rows * kMaxQueryRows);
  const std::size_t pairs_bytes = RoundUp(sizeof(std::uint32_t) * (tile_rows / 2) * kMaxQueryRows);
  const std::size_t total = acc_bytes + q_bytes + k_bytes + scores_bytes + pairs_bytes;
  storage_ = std::aligned_alloc(64, total);
  if (storage_ == nullptr) throw std::bad_alloc();
  char* p = static_cast<char*>(storage_);
  acc_ = reinterpret_cast<float*>(p);
  q_ = p + acc_bytes;
  k_ = p + acc_bytes + q_bytes;
  scores_ = reinterpret_cast<float*>(p + acc_bytes + q_bytes + k_bytes);
  pairs_ = reinterpret_cast<std::uint32_t*>(p + acc_bytes + q_bytes + k_bytes + scores_bytes);
}

QueryBlock::~QueryBlock() { std::free(storage_); }

namespace {

void RestartSoftmax(QueryBlock& b) {
  b.acc_empty_ = true;  // the first tile's PV starts from 0 instead of reading acc
  std::fill_n(b.max, b.padded_rows, -std::numeric_limits<float>::infinity());
  std::fill_n(b.sum, b.padded_rows, 0.0f);
  std::fill_n(b.weight_sum, b.padded_rows, 0.0f);
}

// How many of `prefetch`'s rows to prefetch: its first tile.
int FirstTileRows(const KvPrefetch& prefetch, const QueryBlock& b) {
  return static_cast<int>(std::min<std::int64_t>(prefetch.count, b.tile_tokens));
}

}  // namespace

void LoadQueryRows(const std::uint8_t* q, const std::uint16_t* q_rope, int num_rows,
                   QueryBlock& b, const KvPrefetch& prefetch) {
  b.kernels = ActiveKernels();  // a kept block follows the environment of this call
  b.num_rows = num_rows;
  b.padded_rows = (num_rows + kRowAlign - 1) / kRowAlign * kRowAlign;
  b.loaded_q_ = nullptr;
  const int count = FirstTileRows(prefetch, b);
  if (b.kernels == TileKernels::kAvx512Bf16) {
    bf16::LoadQuery(q, q_rope, b, prefetch.kv, prefetch.ids, count);
  } else {
    LoadQueryFp32(q, q_rope, b, prefetch.kv, prefetch.ids, count);
  }
  RestartSoftmax(b);
}

std::uint64_t NewCallId() {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1);
}

void LoadQueryRowsOnce(const std::uint8_t* q, const std::uint16_t* q_rope, int num_rows,
                       std::uint64_t call_id, QueryBlock& b, const KvPrefetch& prefetch) {
  if (b.loaded_q_ == q && b.loaded_rows_ == num_rows && b.loaded_call_ == call_id) {
    RestartSoftmax(b);
    RowPrefetch rows{prefetch.kv.kv, prefetch.kv.kv_rope, prefetch.ids,
                     FirstTileRows(prefetch, b)};
    rows.Next(b.tile_tokens);  // nothing to overlap with: at once
    return;
  }
  LoadQueryRows(q, q_rope, num_rows, b, prefetch);
  b.loaded_q_ = q;
  b.loaded_rows_ = num_rows;
  b.loaded_call_ = call_id;
}

void AttendKvRows(const KvRows& kv, const std::int32_t* kv_ids, std::int64_t num_tokens,
                  float softmax_scale, QueryBlock& b) {
  for (std::int64_t t0 = 0; t0 < num_tokens; t0 += b.tile_tokens) {
    const int n = static_cast<int>(std::min<std::int64_t>(b.tile_tokens, num_tokens - t0));
    const int next_n = static_cast<int>(std::min<std::int64_t>(b.tile_tokens, num_tokens - t0 - n));
    if (b.kernels == TileKernels::kAvx512Bf16) {
      bf16::AttendTile(kv, kv_ids + t0, n, softmax_scale, b, kv_ids + t0 + n, next_n);
    } else {
      AttendTileFp32(kv, kv_ids + t0, n, softmax_scale, b, kv_ids + t0 + n, next_n);
    }
  }
  if (b.acc_empty_) {  // no tokens: the accumulator is 0
    std::fill_n(b.acc_, static_cast<std::size_t>(kHeadDim) * b.num_rows, 0.0f);
    b.acc_empty_ = false;
  }
}

}  // namespace jax_mla::host
