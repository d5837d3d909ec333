// The one Python entry point of the C++ side: FFI handler capsules per platform, plus pure
// helpers (plans, kernarg bytes) exposed for tests. Each family's bindings live in its own file.
#include <pybind11/pybind11.h>

#include "bindings/parts.h"
#include "xla/ffi/api/c_api.h"

namespace py = pybind11;

#ifndef JAX_MLA_VERSION
#define JAX_MLA_VERSION "0.0.0"
#endif

PYBIND11_MODULE(_ext, m) {
  m.doc() = "jax_mla C++ extension: XLA FFI handlers, kernel plans, host executors";
  m.attr("__version__") = JAX_MLA_VERSION;
  m.attr("XLA_FFI_API_MAJOR") = XLA_FFI_API_MAJOR;
  m.attr("XLA_FFI_API_MINOR") = XLA_FFI_API_MINOR;

  py::dict cpu, rocm;
  jax_mla::AddSplitBindings(m, cpu, rocm);
  jax_mla::AddPersistentBindings(m, cpu, rocm);
  jax_mla::AddHipBindings(m);
  py::dict regs;
  regs["cpu"] = cpu;   // platform names exactly as jax.ffi.register_ffi_target wants them
  regs["ROCM"] = rocm;
  m.def("registrations", [regs] { return regs; },
        "{platform: {FFI target name: handler capsule}}");
}
