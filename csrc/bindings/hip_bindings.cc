// HIP runtime and code objects: images registered from Python after it found and verified the
// file, a library path override for tests, and the runtime's load status.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>

#include "bindings/parts.h"
#include "bindings/split_addresses.h"
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
  m.def(
      "hip_prepare",
      [](const std::string& kernel_id, int device) {
        auto kernel = KernelIdFromManifestId(kernel_id);
        if (!kernel) throw py::value_error("hip_prepare: unknown kernel id '" + kernel_id + "'");
        Status s = PrepareKernel(*kernel, device);
        if (!s.ok()) throw std::runtime_error(s.message());
      },
      py::arg("kernel_id"), py::arg("device"),
      "Loads (once) the kernel's module on `device`, as the FFI Initialize stage does; raises "
      "RuntimeError with the reason.");
  m.def(
      "hip_launch_split",
      [](const std::map<std::string, std::uint64_t>& addresses, std::int64_t num_seqs,
         std::int64_t num_heads, std::int64_t tokens_per_seq, std::int64_t num_kv_splits,
         std::uintptr_t stream, int device) {
        const SplitProblem p = SplitProblemFromAddresses(addresses, num_seqs, num_heads,
                                                         tokens_per_seq, num_kv_splits);
        LaunchPlan plan;
        Status s = PlanSplit(p, &plan);
        if (!s.ok()) throw py::value_error(s.message());
        s = LaunchOnHip(plan, reinterpret_cast<hipStream_t>(stream), device);
        if (!s.ok()) throw std::runtime_error(s.message());
      },
      py::arg("addresses"), py::arg("num_seqs"), py::arg("num_heads"), py::arg("tokens_per_seq"),
      py::arg("num_kv_splits"), py::arg("stream"), py::arg("device"),
      "Plans the nm kernel and launches it on a raw HIP stream, outside XLA: the path the ROCm "
      "handler takes, for tests with a stand-in HIP library and for diagnostics.");
}

}  // namespace jax_mla
