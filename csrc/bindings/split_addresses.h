// {buffer name: address} from Python -> SplitProblem addresses; shared by the split and HIP
// bindings (split_plan, hip_launch_split). Throws py::value_error on an unknown name.
#ifndef JAX_MLA_BINDINGS_SPLIT_ADDRESSES_H_
#define JAX_MLA_BINDINGS_SPLIT_ADDRESSES_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <map>
#include <string>

#include "split/plan.h"

namespace jax_mla {

inline SplitProblem SplitProblemFromAddresses(
    const std::map<std::string, std::uint64_t>& addresses, std::int64_t num_seqs,
    std::int64_t num_heads, std::int64_t tokens_per_seq, std::int64_t num_kv_splits) {
  const std::map<std::string, std::uint64_t SplitProblem::*> fields = {
      {"out", &SplitProblem::out},
      {"partial_lse", &SplitProblem::partial_lse},
      {"valid_split_count", &SplitProblem::valid_split_count},
      {"q", &SplitProblem::q},
      {"q_rope", &SplitProblem::q_rope},
      {"kv", &SplitProblem::kv},
      {"kv_rope", &SplitProblem::kv_rope},
      {"kv_indptr", &SplitProblem::kv_indptr},
      {"kv_indices", &SplitProblem::kv_indices},
      {"qo_indptr", &SplitProblem::qo_indptr},
      {"split_indptr", &SplitProblem::split_indptr},
      {"sink", &SplitProblem::sink}};
  SplitProblem p;
  for (const auto& [name, value] : addresses) {
    auto field = fields.find(name);
    if (field == fields.end()) {
      std::string known;
      for (const auto& f : fields) known += " " + f.first;
      throw pybind11::value_error("unknown address '" + name + "'; known:" + known);
    }
    p.*(field->second) = value;
  }
  p.num_seqs = num_seqs;
  p.num_heads = num_heads;
  p.tokens_per_seq = tokens_per_seq;
  p.num_kv_splits = num_kv_splits;
  return p;
}

}  // namespace jax_mla

#endif  // JAX_MLA_BINDINGS_SPLIT_ADDRESSES_H_
