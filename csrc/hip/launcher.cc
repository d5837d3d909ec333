#include "hip/launcher.h"

#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "hip/hip_runtime.h"

namespace jax_mla {
namespace {

struct LauncherState {
  std::mutex mutex;
  std::map<KernelId, std::string> images;
  std::map<std::pair<int, KernelId>, hipFunction_t> functions;  // (device, kernel)
};

LauncherState& State() {
  static LauncherState* state = new LauncherState();  // never destroyed
  return *state;
}

std::string KernelName(KernelId kernel) { return KernelManifestId(kernel); }

Status HipFailure(const HipApi& api, hipError_t code, const std::string& call, KernelId kernel,
                  int device) {
  return Status::Internal("jax_mla: " + call + " failed for kernel " + KernelName(kernel) +
                          " on device " + std::to_string(device) + ": " +
                          HipErrorText(api, code));
}

Status ArchOf(const HipApi& api, int device, std::string* arch) {
  std::vector<char> props(2 * kHipDevicePropR0600Bytes, 0);  // slack against a larger struct
  const hipError_t code = api.get_device_properties(props.data(), device);
  if (code != kHipSuccess) {
    return Status::Internal("jax_mla: hipGetDevicePropertiesR0600(device " +
                            std::to_string(device) + ") failed: " + HipErrorText(api, code));
  }
  const char* name = props.data() + kHipDevicePropR0600GcnArchNameOffset;
  *arch = std::string(name, strnlen(name, 256));
  return Status::Ok();
}

// Loads the module on `device` (made current for the load, then restored). Caller holds the lock.
Status LoadLocked(LauncherState& s, const HipApi& api, KernelId kernel, int device,
                  hipFunction_t* fn) {
  auto cached = s.functions.find({device, kernel});
  if (cached != s.functions.end()) {
    *fn = cached->second;
    return Status::Ok();
  }
  auto image = s.images.find(kernel);
  if (image == s.images.end()) {
    return Status::FailedPrecondition(
        "jax_mla: no code object registered for kernel " + KernelName(kernel) +
        " (Python registers it with _ext.register_code_object after finding the file)");
  }
  std::string arch;
  JAX_MLA_RETURN_IF_ERROR(ArchOf(api, device, &arch));
  const std::string base = arch.substr(0, arch.find(':'));  // "gfx950:sramecc+:xnack-"
  if (base != "gfx950") {
    return Status::FailedPrecondition("jax_mla: kernel " + KernelName(kernel) +
                                      " needs a gfx950 device; device " + std::to_string(device) +
                                      " is '" + arch + "'");
  }
  int previous = 0;
  hipError_t code = api.get_device(&previous);
  if (code != kHipSuccess) return HipFailure(api, code, "hipGetDevice", kernel, device);
  code = api.set_device(device);
  if (code != kHipSuccess) return HipFailure(api, code, "hipSetDevice", kernel, device);
  hipModule_t module = nullptr;
  code = api.module_load_data(&module, image->second.data());
  Status status = code == kHipSuccess ? Status::Ok()
                                      : HipFailure(api, code, "hipModuleLoadData", kernel, device);
  hipFunction_t function = nullptr;
  if (status.ok()) {
    code = api.module_get_function(&function, module, KernelSymbol(kernel));
    if (code != kHipSuccess) {
      status = HipFailure(api, code, std::string("hipModuleGetFunction(") + KernelSymbol(kernel) + ")",
                          kernel, device);
    }
  }
  const hipError_t restore = api.set_device(previous);
  if (status.ok() && restore != kHipSuccess) {
    status = HipFailure(api, restore, "hipSetDevice (restore)", kernel, device);
  }
  if (!status.ok()) {
    // A module that loaded but is not cached would leak (one per failed launch): unload it.
    // Its own error, if any, is secondary to the one reported.
    if (module != nullptr) api.module_unload(module);
    return status;
  }
  s.functions[{device, kernel}] = function;
  *fn = function;
  return Status::Ok();
}

// Every launch failure names the kernel, also those that happen before the kernel matters (the
// HIP library missing, a device that cannot be queried).
Status NamingKernel(Status status, KernelId kernel, int device) {
  const std::string name = "kernel " + KernelName(kernel);
  if (status.ok() || status.message().find(name) != std::string::npos) return status;
  return Status(status.code(), "jax_mla: " + name + " on device " + std::to_string(device) +
                                   ": " + status.message());
}

Status FunctionFor(KernelId kernel, int device, const HipApi** api, hipFunction_t* fn) {
  JAX_MLA_RETURN_IF_ERROR(NamingKernel(GetHipApi(api), kernel, device));
  LauncherState& s = State();
  std::lock_guard<std::mutex> lock(s.mutex);
  return NamingKernel(LoadLocked(s, **api, kernel, device, fn), kernel, device);
}

}  // namespace

std::optional<KernelId> KernelIdFromManifestId(std::string_view manifest_id) {
  for (KernelId k : {KernelId::kSplitNm, KernelId::kPersistentNmPs}) {
    if (manifest_id == KernelManifestId(k)) return k;
  }
  return std::nullopt;
}

void RegisterCodeObject(KernelId kernel, std::string image) {
  LauncherState& s = State();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.images[kernel] = std::move(image);
  for (auto it = s.functions.begin(); it != s.functions.end();) {
    it = it->first.second == kernel ? s.functions.erase(it) : std::next(it);
  }
}

bool HasCodeObject(KernelId kernel) {
  LauncherState& s = State();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.images.count(kernel) != 0;
}

Status CheckDeviceIsGfx950(int device) {
  const HipApi* api = nullptr;
  JAX_MLA_RETURN_IF_ERROR(GetHipApi(&api));
  std::string arch;
  JAX_MLA_RETURN_IF_ERROR(ArchOf(*api, device, &arch));
  if (arch.substr(0, arch.find(':')) != "gfx950") {
    return Status::FailedPrecondition("jax_mla: device " + std::to_string(device) + " is '" + arch +
                                      "', not gfx950");
  }
  return Status::Ok();
}

Status PrepareKernel(KernelId kernel, int device) {
  const HipApi* api = nullptr;
  hipFunction_t fn = nullptr;
  return FunctionFor(kernel, device, &api, &fn);
}

Status LaunchOnHip(const LaunchPlan& plan, hipStream_t stream, int device) {
  const HipApi* api = nullptr;
  hipFunction_t fn = nullptr;
  JAX_MLA_RETURN_IF_ERROR(FunctionFor(plan.kernel, device, &api, &fn));
  // HIP copies the kernarg buffer at launch, so a stack copy is enough.
  std::array<std::uint8_t, kKernargBytes> args = plan.kernargs;
  std::size_t size = args.size();
  void* extra[] = {HIP_LAUNCH_PARAM_BUFFER_POINTER, args.data(), HIP_LAUNCH_PARAM_BUFFER_SIZE,
                   &size, HIP_LAUNCH_PARAM_END};
  const hipError_t code = api->module_launch_kernel(
      fn, plan.grid.x, plan.grid.y, plan.grid.z, plan.block.x, plan.block.y, plan.block.z,
      plan.shared_mem_bytes, stream, nullptr, extra);
  if (code != kHipSuccess) {
    return HipFailure(*api, code, "hipModuleLaunchKernel", plan.kernel, device);
  }
  return Status::Ok();
}

void ForgetLoadedModules() {
  LauncherState& s = State();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.functions.clear();
}

}  // namespace jax_mla
