// Launching a LaunchPlan on a HIP stream through the HIP module API.
//
// Code-object images come from Python (after it found and verified the file) through
// RegisterCodeObject. A module is loaded once per (device, kernel) and cached under a mutex.
// Loading happens in PrepareKernel, which the ROCm handlers call from their FFI Initialize stage
// (before execution, outside any command-buffer capture); LaunchOnHip falls back to loading under
// the same mutex on first use, for runtimes that skip Initialize. Modules are never unloaded: a
// captured graph may still reference their functions.
#ifndef JAX_MLA_HIP_LAUNCHER_H_
#define JAX_MLA_HIP_LAUNCHER_H_

#include <optional>
#include <string>
#include <string_view>

#include "common/launch_plan.h"
#include "common/status.h"
#include "hip/hip_api.h"

namespace jax_mla {

// "mla_v4_nm" / "mla_v4_nm_ps" (KernelManifestId) -> KernelId.
std::optional<KernelId> KernelIdFromManifestId(std::string_view manifest_id);

// Stores the image for `kernel`, replacing an earlier one; modules loaded from the earlier image
// are forgotten (not unloaded) so the next launch loads the new one.
void RegisterCodeObject(KernelId kernel, std::string image);
bool HasCodeObject(KernelId kernel);

// FailedPrecondition unless device `device` reports gcnArchName gfx950.
Status CheckDeviceIsGfx950(int device);

// Loads (once) the module and function of `kernel` on `device`, after the arch check.
Status PrepareKernel(KernelId kernel, int device);

// hipModuleLaunchKernel(fn, grid, block, shared mem, stream, nullptr, extra = {kernarg buffer}).
// Every HIP return code becomes a Status naming the kernel and hipGetErrorString.
Status LaunchOnHip(const LaunchPlan& plan, hipStream_t stream, int device);

// Forgets every cached module (after SetHipLibraryPath); images stay registered.
void ForgetLoadedModules();

}  // namespace jax_mla

#endif  // JAX_MLA_HIP_LAUNCHER_H_
