// Split family (nm kernel): the jax_mla_split_decode_v1 handlers for cpu and ROCM, and
// split_plan(...) so tests can read the plan's kernarg bytes and grid without running anything.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <string>

#include "bindings/parts.h"
#include "bindings/split_addresses.h"
#include "common/launch_plan.h"
#include "split/ffi_handlers.h"
#include "split/plan.h"

namespace py = pybind11;

namespace jax_mla {
namespace {

py::capsule Capsule(XLA_FFI_Error* (*handler)(XLA_FFI_CallFrame*)) {
  return py::capsule(reinterpret_cast<void*>(handler));
}

py::dict PlanToDict(const LaunchPlan& plan) {
  py::dict d;
  d["kernel"] = KernelManifestId(plan.kernel);
  d["symbol"] = KernelSymbol(plan.kernel);
  d["kernargs"] = py::bytes(reinterpret_cast<const char*>(plan.kernargs.data()),
                            plan.kernargs.size());
  d["grid"] = py::make_tuple(plan.grid.x, plan.grid.y, plan.grid.z);
  d["block"] = py::make_tuple(plan.block.x, plan.block.y, plan.block.z);
  d["shared_mem_bytes"] = plan.shared_mem_bytes;
  return d;
}

}  // namespace

void AddSplitBindings(py::module_& m, py::dict& cpu, py::dict& rocm) {
  cpu[kSplitDecodeTarget] = Capsule(JaxMlaSplitDecodeCpu);
  py::dict rocm_bundle;
  rocm_bundle["initialize"] = Capsule(JaxMlaSplitDecodeRocmInitialize);
  rocm_bundle["execute"] = Capsule(JaxMlaSplitDecodeRocmExecute);
  rocm[kSplitDecodeTarget] = rocm_bundle;

  m.def(
      "split_plan",
      [](const std::map<std::string, std::uint64_t>& addresses, std::int64_t num_seqs,
         std::int64_t num_heads, std::int64_t tokens_per_seq, std::int64_t num_kv_splits) {
        const SplitProblem p = SplitProblemFromAddresses(addresses, num_seqs, num_heads,
                                                         tokens_per_seq, num_kv_splits);
        LaunchPlan plan;
        Status s = PlanSplit(p, &plan);
        if (!s.ok()) throw py::value_error(s.message());
        return PlanToDict(plan);
      },
      py::arg("addresses"), py::arg("num_seqs"), py::arg("num_heads"), py::arg("tokens_per_seq"),
      py::arg("num_kv_splits"),
      "The nm kernel's plan for a problem: dict(kernel, symbol, kernargs (336 bytes), grid, block, "
      "shared_mem_bytes). addresses: {buffer name: address}; ValueError on a bad problem.");
  m.def("split_supported_shapes", [] { return std::string(SplitSupportedShapesText()); });
}

}  // namespace jax_mla
