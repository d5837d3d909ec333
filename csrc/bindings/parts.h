// Each kernel family adds its bindings here: handler capsules into the per-platform dicts that
// `registrations()` returns, plus pure helpers for tests. One function per family, one file each.
#ifndef JAX_MLA_BINDINGS_PARTS_H_
#define JAX_MLA_BINDINGS_PARTS_H_

#include <pybind11/pybind11.h>

namespace jax_mla {

// cpu / rocm: {target name: capsule} dicts that registrations() returns under "cpu" / "ROCM".
void AddSplitBindings(pybind11::module_& m, pybind11::dict& cpu, pybind11::dict& rocm);
void AddPersistentBindings(pybind11::module_& m, pybind11::dict& cpu, pybind11::dict& rocm);
// Code-object images handed over by Python after verification, HIP runtime status.
void AddHipBindings(pybind11::module_& m);

}  // namespace jax_mla

#endif  // JAX_MLA_BINDINGS_PARTS_H_
