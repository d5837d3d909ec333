// What both families' FFI handlers do with a buffer before planning: re-check its dtype and dims
// (Python checked them already; bind can be called directly), and take its address for a kernarg.
#ifndef JAX_MLA_COMMON_FFI_OPERANDS_H_
#define JAX_MLA_COMMON_FFI_OPERANDS_H_

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "common/status.h"
#include "xla/ffi/api/ffi.h"

namespace jax_mla {

// An expected extent that matches any extent (not -1, which arithmetic on a missing extent gives).
inline constexpr std::int64_t kAnyExtent = std::numeric_limits<std::int64_t>::min();

// "[2,16,512]"
std::string DimsText(xla::ffi::Span<const std::int64_t> dims);

// "u8", "bf16", ...; "dtype#N" for one the handlers never expect.
std::string DtypeName(xla::ffi::DataType dtype);

// InvalidArgument "<who>: <name> has dtype s8 dims [2,16,512]; expected u8 dims [2,16,512]"
// unless the buffer has this dtype and these dims (kAnyExtent, shown as ?, matches any extent).
// name says which operand or result, e.g. "q (operand 0)".
Status CheckOperand(const xla::ffi::AnyBuffer& buffer, const char* who, const char* name,
                    xla::ffi::DataType dtype, const std::vector<std::int64_t>& dims);

// One buffer's expectation for CheckOperands.
struct OperandSpec {
  const xla::ffi::AnyBuffer& buffer;
  const char* name;
  xla::ffi::DataType dtype;
  std::vector<std::int64_t> dims;
};

// CheckOperand on each, in order: the first mismatch, or Ok.
Status CheckOperands(std::initializer_list<OperandSpec> specs, const char* who);

// dims[0] when the buffer has this rank, else -1: the extent other operands are checked against,
// computed before the buffer's own check (which then refuses the rank).
std::int64_t LeadingExtent(const xla::ffi::AnyBuffer& buffer, std::size_t rank);

// The buffer's address for a kernarg. XLA may give a zero-element buffer (no kv_indices when every
// row is empty, an empty kv pool) a null address; plans refuse nulls, so such a buffer gets a
// dummy address that is never read (its bounds say 0 entries).
std::uint64_t OperandAddress(const xla::ffi::AnyBuffer& buffer);

}  // namespace jax_mla

#endif  // JAX_MLA_COMMON_FFI_OPERANDS_H_
