// The FFI handlers of target "jax_mla_persistent_decode_v1", one per platform.
#ifndef JAX_MLA_PERSISTENT_FFI_HANDLERS_H_
#define JAX_MLA_PERSISTENT_FFI_HANDLERS_H_

#include "xla/ffi/api/c_api.h"

namespace jax_mla {

inline constexpr const char kPersistentTarget[] = "jax_mla_persistent_decode_v1";

// cpu: plan + host executor. Attributes: fill_unwritten_nan, num_partitions, return_lse.
XLA_FFI_Handler* PersistentDecodeCpuHandler();
// ROCM: Initialize loads the nm_ps module on the device (PrepareKernel); execute plans and
// launches through LaunchOnHip. Attributes: num_partitions, return_lse.
XLA_FFI_Handler* PersistentDecodeRocmInitializeHandler();
XLA_FFI_Handler* PersistentDecodeRocmHandler();

}  // namespace jax_mla

#endif  // JAX_MLA_PERSISTENT_FFI_HANDLERS_H_
