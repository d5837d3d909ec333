// Python side of the persistent family: the FFI handler capsules, and the pure plan for tests.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "bindings/parts.h"
#include "common/launch_plan.h"
#include "hip/hip_api.h"
#include "hip/launcher.h"
#include "persistent/ffi_handlers.h"
#include "persistent/plan.h"

namespace py = pybind11;

namespace jax_mla {
namespace {

py::tuple ToTuple(const Dim3& d) { return py::make_tuple(d.x, d.y, d.z); }

// addresses: {"q", "q_rope", "kv", "kv_rope", "kv_indptr", "kv_indices", "sink", "out", "lse",
// "o_acc", "lse_acc", "desc", "cnt", "arange"} -> int; missing keys are 0.
LaunchPlan PlanOrThrow(const py::dict& addresses, std::uint32_t num_rows,
                       std::uint32_t num_partitions, bool return_lse, py::object planner_config,
                       std::uint32_t num_heads) {
  PersistentProblem p;
  struct { const char* name; std::uint64_t* field; } fields[] = {
      {"q", &p.q}, {"q_rope", &p.q_rope}, {"kv", &p.kv}, {"kv_rope", &p.kv_rope},
      {"kv_indptr", &p.kv_indptr}, {"kv_indices", &p.kv_indices}, {"sink", &p.sink},
      {"out", &p.out}, {"lse", &p.lse}, {"o_acc", &p.o_acc}, {"lse_acc", &p.lse_acc},
      {"desc", &p.desc}, {"cnt", &p.cnt}, {"arange", &p.arange}};
  std::size_t known = 0;
  for (const auto& f : fields) {
    if (addresses.contains(f.name)) {
      *f.field = addresses[f.name].cast<std::uint64_t>();
      ++known;
    }
  }
  if (known != addresses.size()) {
    throw py::value_error("persistent_plan: unknown key in addresses; known keys are q, q_rope, "
                          "kv, kv_rope, kv_indptr, kv_indices, sink, out, lse, o_acc, lse_acc, "
                          "desc, cnt, arange");
  }
  p.num_rows = num_rows;
  p.num_partitions = num_partitions;
  p.return_lse = return_lse;
  p.num_heads = num_heads;
  if (!planner_config.is_none()) p.planner_config = planner_config.cast<std::uint32_t>();
  LaunchPlan plan;
  const Status s = PlanPersistent(p, &plan);
  if (!s.ok()) throw py::value_error(s.message());
  return plan;
}

py::dict PersistentPlanForPython(const py::dict& addresses, std::uint32_t num_rows,
                                 std::uint32_t num_partitions, bool return_lse,
                                 py::object planner_config, std::uint32_t num_heads) {
  const LaunchPlan plan =
      PlanOrThrow(addresses, num_rows, num_partitions, return_lse, planner_config, num_heads);
  py::dict d;
  d["kernel"] = KernelManifestId(plan.kernel);
  d["symbol"] = KernelSymbol(plan.kernel);
  d["kernargs"] = py::bytes(reinterpret_cast<const char*>(plan.kernargs.data()), plan.kernargs.size());
  d["grid"] = ToTuple(plan.grid);
  d["block"] = ToTuple(plan.block);
  d["shared_mem_bytes"] = plan.shared_mem_bytes;
  return d;
}

}  // namespace

void AddPersistentBindings(py::module_& m, py::dict& cpu, py::dict& rocm) {
  cpu[kPersistentTarget] = py::capsule(reinterpret_cast<void*>(PersistentDecodeCpuHandler()));
  py::dict rocm_bundle;
  rocm_bundle["initialize"] =
      py::capsule(reinterpret_cast<void*>(PersistentDecodeRocmInitializeHandler()));
  rocm_bundle["execute"] = py::capsule(reinterpret_cast<void*>(PersistentDecodeRocmHandler()));
  rocm[kPersistentTarget] = rocm_bundle;
  m.def("persistent_plan", &PersistentPlanForPython, py::arg("addresses"), py::arg("num_rows"),
        py::arg("num_partitions"), py::arg("return_lse"), py::arg("planner_config") = py::none(),
        py::arg("num_heads") = kPersistentHeads,
        "The nm_ps launch plan: dict(kernel, symbol, kernargs: bytes, grid, block, "
        "shared_mem_bytes). Raises ValueError where the C++ plan returns an error.");
  m.def(
      "hip_launch_persistent",
      [](const py::dict& addresses, std::uint32_t num_rows, std::uint32_t num_partitions,
         bool return_lse, std::uintptr_t stream, int device) {
        const LaunchPlan plan =
            PlanOrThrow(addresses, num_rows, num_partitions, return_lse, py::none(), kPersistentHeads);
        const Status s = LaunchOnHip(plan, reinterpret_cast<hipStream_t>(stream), device);
        if (!s.ok()) throw std::runtime_error(s.message());
      },
      py::arg("addresses"), py::arg("num_rows"), py::arg("num_partitions"), py::arg("return_lse"),
      py::arg("stream"), py::arg("device"),
      "Plans the nm_ps kernel and launches it on a raw HIP stream, outside XLA: the ROCm "
      "handler's path, for tests with a stand-in HIP library.");
  m.attr("PERSISTENT_CNT_ENTRIES") = kPersistentCntEntries;
}

}  // namespace jax_mla
