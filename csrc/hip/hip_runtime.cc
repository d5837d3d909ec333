#include "hip/hip_runtime.h"

#include <dlfcn.h>

#include <mutex>
#include <utility>
#include <vector>

namespace jax_mla {
namespace {

struct RuntimeState {
  std::mutex mutex;
  std::string path_override;
  bool attempted = false;
  Status status;
  std::string loaded_from;
  HipApi api;
};

RuntimeState& State() {
  static RuntimeState* state = new RuntimeState();  // never destroyed: used at exit by XLA
  return *state;
}

template <typename Fn>
Status Resolve(void* library, const std::string& from, const char* symbol, Fn* out) {
  dlerror();
  void* address = dlsym(library, symbol);
  if (address == nullptr) {
    return Status::NotFound(std::string("jax_mla: HIP symbol ") + symbol + " not found in " + from);
  }
  *out = reinterpret_cast<Fn>(address);
  return Status::Ok();
}

Status Load(RuntimeState& s) {
  std::vector<std::string> candidates;
  if (!s.path_override.empty()) {
    candidates.push_back(s.path_override);
  } else {
    candidates = {"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6"};
  }
  std::string errors;
  void* library = nullptr;
  std::string from;
  for (const std::string& name : candidates) {
    library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) {
      from = name;
      break;
    }
    const char* e = dlerror();
    errors += "\n  " + name + ": " + (e ? e : "unknown dlopen error");
  }
  if (library == nullptr) {
    return Status::Unavailable("jax_mla: could not load the HIP runtime (libamdhip64):" + errors);
  }
  HipApi api;
  JAX_MLA_RETURN_IF_ERROR(Resolve(library, from, "hipModuleLoadData", &api.module_load_data));
  JAX_MLA_RETURN_IF_ERROR(Resolve(library, from, "hipModuleGetFunction", &api.module_get_function));
  JAX_MLA_RETURN_IF_ERROR(Resolve(library, from, "hipModuleUnload", &api.module_unload));
  JAX_MLA_RETURN_IF_ERROR(
      Resolve(library, from, "hipModuleLaunchKernel", &api.module_launch_kernel));
  JAX_MLA_RETURN_IF_ERROR(Resolve(library, from, "hipGetErrorString", &api.get_error_string));
  // ROCm >= 6 renamed the entry point; the unsuffixed one uses an older struct layout.
  JAX_MLA_RETURN_IF_ERROR(
      Resolve(library, from, "hipGetDevicePropertiesR0600", &api.get_device_properties));
  JAX_MLA_RETURN_IF_ERROR(Resolve(library, from, "hipGetDevice", &api.get_device));
  JAX_MLA_RETURN_IF_ERROR(Resolve(library, from, "hipSetDevice", &api.set_device));
  s.api = api;
  s.loaded_from = from;
  return Status::Ok();
}

}  // namespace

Status GetHipApi(const HipApi** api) {
  RuntimeState& s = State();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.attempted) {
    s.status = Load(s);
    s.attempted = true;
  }
  if (!s.status.ok()) return s.status;
  *api = &s.api;
  return Status::Ok();
}

void SetHipLibraryPath(const std::string& path) {
  RuntimeState& s = State();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.path_override = path;
  s.attempted = false;
  s.loaded_from.clear();
}

std::pair<bool, std::string> HipRuntimeStatus() {
  const HipApi* api = nullptr;
  Status status = GetHipApi(&api);
  if (!status.ok()) return {false, status.message()};
  RuntimeState& s = State();
  std::lock_guard<std::mutex> lock(s.mutex);
  return {true, s.loaded_from};
}

std::string HipErrorText(const HipApi& api, hipError_t code) {
  const char* text = api.get_error_string ? api.get_error_string(code) : nullptr;
  return std::string(text ? text : "unknown HIP error") + " (code " + std::to_string(code) + ")";
}

}  // namespace jax_mla
