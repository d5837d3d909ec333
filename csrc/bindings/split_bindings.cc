// Placeholder until the split family lands.
#include "bindings/parts.h"
namespace jax_mla {
void AddSplitBindings(pybind11::module_&, pybind11::dict&, pybind11::dict&) {}
}  // namespace jax_mla
