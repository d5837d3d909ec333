// libamdhip64, opened with dlopen at first use so that the extension builds and imports without
// ROCm. Tries libamdhip64.so, .so.7, .so.6 unless a path was set (tests use a stand-in library).
#ifndef JAX_MLA_HIP_HIP_RUNTIME_H_
#define JAX_MLA_HIP_HIP_RUNTIME_H_

#include <string>

#include "common/status.h"
#include "hip/hip_api.h"

namespace jax_mla {

struct HipApi {
  HipModuleLoadDataFn module_load_data = nullptr;
  HipModuleGetFunctionFn module_get_function = nullptr;
  HipModuleUnloadFn module_unload = nullptr;
  HipModuleLaunchKernelFn module_launch_kernel = nullptr;
  HipGetErrorStringFn get_error_string = nullptr;
  HipGetDevicePropertiesR0600Fn get_device_properties = nullptr;  // hipGetDevicePropertiesR0600
  HipGetDeviceFn get_device = nullptr;
  HipSetDeviceFn set_device = nullptr;
};

// The loaded API (kept for the life of the process), or a Status naming the library or symbol
// that is missing. The first call loads; later calls return the same result.
Status GetHipApi(const HipApi** api);

// Use `path` for the next load instead of the default names; forgets a previous load (its
// library stays mapped: launched kernels may still reference it).
void SetHipLibraryPath(const std::string& path);

// {loaded, library path or the reason it did not load}; attempts the load if not yet tried.
std::pair<bool, std::string> HipRuntimeStatus();

// "hipErrorX (code N)" text for a return code, through hipGetErrorString when available.
std::string HipErrorText(const HipApi& api, hipError_t code);

}  // namespace jax_mla

#endif  // JAX_MLA_HIP_HIP_RUNTIME_H_
