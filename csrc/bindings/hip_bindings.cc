// HIP runtime and code objects: images registered from Python after it found and verified the
// file, a library path override for tests, and the runtime's load status.
#include <pybind11/pybind11.h>

#include <string>

#include "bindings/parts.h"
#include "hip/hip_runtime.h"
#include "hip/launcher.h"

namespace py = pybind11;

namespace jax_mla {

void AddHipBindings(py::module_& m) {
  m.def(
      "register_code_object",
      [](const std::string& kernel_id, py::bytes image) {
        auto kernel = KernelIdFromManifestId(kernel_id);
        if (!kernel) {
          throw py::value_error("register_code_object: unknown kernel id '" + kernel_id +
                                "'; known: mla_v4_nm, mla_v4_nm_ps");
        }
        std::string bytes = image;
        if (bytes.empty()) throw py::value_error("register_code_object: empty image");
        RegisterCodeObject(*kernel, std::move(bytes));
      },
      py::arg("kernel_id"), py::arg("image"),
      "Hands a verified code-object image to the launcher; replaces an earlier one.");
  m.def(
      "has_code_object",
      [](const std::string& kernel_id) {
        auto kernel = KernelIdFromManifestId(kernel_id);
        return kernel.has_value() && HasCodeObject(*kernel);
      },
      py::arg("kernel_id"));
  m.def(
      "set_hip_library",
      [](const std::string& path) {
        SetHipLibraryPath(path);
        ForgetLoadedModules();
      },
      py::arg("path"),
      "Loads the HIP runtime from `path` at next use (tests: a stand-in library); '' restores "
      "the default search (libamdhip64.so, .so.7, .so.6).");
  m.def(
      "hip_status",
      [] {
        auto [loaded, detail] = HipRuntimeStatus();
        py::dict d;
        d["loaded"] = loaded;
        d[loaded ? "library" : "reason"] = detail;
        return d;
      },
      "{'loaded': True, 'library': path} or {'loaded': False, 'reason': why}.");
}

}  // namespace jax_mla
