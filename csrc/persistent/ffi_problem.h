// From the FFI buffers of a jax_mla_persistent_decode_v1 call to the plain PersistentProblem (and
// the PersistentHostBounds the host executor checks against). Cheap re-checks of what Python
// already checked: dtypes, ranks, consistent extents, and that the workspace results alias their
// operands.
#ifndef JAX_MLA_PERSISTENT_FFI_PROBLEM_H_
#define JAX_MLA_PERSISTENT_FFI_PROBLEM_H_

#include "common/status.h"
#include "persistent/host_executor.h"
#include "persistent/plan.h"
#include "xla/ffi/api/ffi.h"

namespace jax_mla {

struct PersistentBuffers {
  xla::ffi::AnyBuffer q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink;
  xla::ffi::AnyBuffer o_acc, lse_acc, desc, cnt, arange;
  // Results (destination buffers); the workspace ones must alias their operands.
  xla::ffi::AnyBuffer out, lse;
  xla::ffi::AnyBuffer o_acc_out, lse_acc_out, desc_out, cnt_out, arange_out;
};

// return_lse: lse is [N, 128] and written; otherwise lse is [0, 128] and the kernarg holds 0.
// num_partitions: the P the caller's workspace was made for, re-checked against its shapes.
Status BuildPersistentProblem(const PersistentBuffers& b, bool return_lse, int num_partitions,
                              PersistentProblem* problem, PersistentHostBounds* bounds);

}  // namespace jax_mla

#endif  // JAX_MLA_PERSISTENT_FFI_PROBLEM_H_
