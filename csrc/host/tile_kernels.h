// The bf16 kernel family (host/tile_bf16.cc) as attention_tile.cc calls it. Internal to the host
// core: executors use host/attention_tile.h.
#ifndef JAX_MLA_HOST_TILE_KERNELS_H_
#define JAX_MLA_HOST_TILE_KERNELS_H_

#include <cstdint>

#include "host/attention_tile.h"

namespace jax_mla::host::bf16 {

// Whether this build has the kernels and the CPU runs them (AVX512 F, BW, VL and BF16).
bool Supported();

// Q rows [num_rows] into block.q_ as bf16 pairs [256][padded_rows] (pad rows zero); meanwhile
// prefetches the `prefetch_count` rows `prefetch_ids` of kv.
void LoadQuery(const std::uint8_t* q, const std::uint16_t* q_rope, QueryBlock& block,
               const KvRows& kv, const std::int32_t* prefetch_ids, int prefetch_count);

// One tile of n (1..tile_tokens) KV rows: scores, the softmax step, PV; meanwhile prefetches
// the next_n rows next_ids (the next tile).
void AttendTile(const KvRows& kv, const std::int32_t* kv_ids, int n, float softmax_scale,
                QueryBlock& block, const std::int32_t* next_ids, int next_n);

}  // namespace jax_mla::host::bf16

#endif  // JAX_MLA_HOST_TILE_KERNELS_H_
