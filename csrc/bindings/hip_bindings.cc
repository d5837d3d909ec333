// Placeholder until the HIP launcher lands.
#include "bindings/parts.h"
namespace jax_mla {
void AddHipBindings(pybind11::module_&) {}
}  // namespace jax_mla
