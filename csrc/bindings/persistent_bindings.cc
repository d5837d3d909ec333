// Placeholder until the persistent family lands.
#include "bindings/parts.h"
namespace jax_mla {
void AddPersistentBindings(pybind11::module_&, pybind11::dict&, pybind11::dict&) {}
}  // namespace jax_mla
