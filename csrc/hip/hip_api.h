// The few HIP runtime declarations jax_mla uses, written out so the build needs no ROCm headers:
// libamdhip64 is opened with dlopen at first use (hip_runtime.h). Signatures and constants from
// HIP's hip_runtime_api.h (see shared/research/code-objects.md section 5).
#ifndef JAX_MLA_HIP_HIP_API_H_
#define JAX_MLA_HIP_HIP_API_H_

#include <cstddef>

struct ihipStream_t;
typedef ihipStream_t* hipStream_t;
struct ihipModule_t;
typedef ihipModule_t* hipModule_t;
struct ihipModuleSymbol_t;
typedef ihipModuleSymbol_t* hipFunction_t;
typedef int hipError_t;  // an enum in HIP (4 bytes); hipSuccess = 0

namespace jax_mla {

inline constexpr hipError_t kHipSuccess = 0;

// hipModuleLaunchKernel `extra` keys for passing the kernarg block as one buffer.
#define HIP_LAUNCH_PARAM_BUFFER_POINTER ((void*)0x01)
#define HIP_LAUNCH_PARAM_BUFFER_SIZE ((void*)0x02)
#define HIP_LAUNCH_PARAM_END ((void*)0x03)

// hipDeviceProp_tR0600 (ROCm >= 6): the layout behind hipGetDevicePropertiesR0600.
inline constexpr std::size_t kHipDevicePropR0600Bytes = 1472;
inline constexpr std::size_t kHipDevicePropR0600GcnArchNameOffset = 1160;  // char[256]

using HipModuleLoadDataFn = hipError_t (*)(hipModule_t* module, const void* image);
using HipModuleGetFunctionFn = hipError_t (*)(hipFunction_t* function, hipModule_t module,
                                              const char* name);
using HipModuleUnloadFn = hipError_t (*)(hipModule_t module);
using HipModuleLaunchKernelFn = hipError_t (*)(hipFunction_t f, unsigned grid_x, unsigned grid_y,
                                               unsigned grid_z, unsigned block_x, unsigned block_y,
                                               unsigned block_z, unsigned shared_mem_bytes,
                                               hipStream_t stream, void** kernel_params,
                                               void** extra);
using HipGetErrorStringFn = const char* (*)(hipError_t error);
using HipGetDevicePropertiesR0600Fn = hipError_t (*)(void* props, int device);
using HipGetDeviceFn = hipError_t (*)(int* device);
using HipSetDeviceFn = hipError_t (*)(int device);

}  // namespace jax_mla

#endif  // JAX_MLA_HIP_HIP_API_H_
