// XLA FFI handlers of target jax_mla_split_decode_v1 (the nm kernel), one per platform.
#ifndef JAX_MLA_SPLIT_FFI_HANDLERS_H_
#define JAX_MLA_SPLIT_FFI_HANDLERS_H_

#include "xla/ffi/api/c_api.h"

namespace jax_mla {

inline constexpr const char kSplitDecodeTarget[] = "jax_mla_split_decode_v1";

}  // namespace jax_mla

// cpu: plan + host executor. Attrs num_kv_splits (i32), tokens_per_seq (i32),
// fill_unwritten_nan (bool).
extern "C" XLA_FFI_Error* JaxMlaSplitDecodeCpu(XLA_FFI_CallFrame* call_frame);
// ROCM: plan + HIP launch (execute), module loading (initialize). Attrs num_kv_splits (i32),
// tokens_per_seq (i32).
extern "C" XLA_FFI_Error* JaxMlaSplitDecodeRocmInitialize(XLA_FFI_CallFrame* call_frame);
extern "C" XLA_FFI_Error* JaxMlaSplitDecodeRocmExecute(XLA_FFI_CallFrame* call_frame);

#endif  // JAX_MLA_SPLIT_FFI_HANDLERS_H_
