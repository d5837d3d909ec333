#include "common/ffi_operands.h"

namespace jax_mla {
namespace ffi = xla::ffi;
namespace {

std::string ExtentsText(const std::vector<std::int64_t>& dims) {
  std::string text = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    text += (i ? "," : "") + (dims[i] == kAnyExtent ? std::string("?") : std::to_string(dims[i]));
  }
  return text + "]";
}

alignas(64) const std::uint8_t kNeverRead[64] = {};

}  // namespace

std::string DimsText(ffi::Span<const std::int64_t> dims) {
  std::string text = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) text += (i ? "," : "") + std::to_string(dims[i]);
  return text + "]";
}

std::string DtypeName(ffi::DataType dtype) {
  switch (dtype) {
    case ffi::U8: return "u8";
    case ffi::S8: return "s8";
    case ffi::U16: return "u16";
    case ffi::S16: return "s16";
    case ffi::U32: return "u32";
    case ffi::S32: return "s32";
    case ffi::U64: return "u64";
    case ffi::S64: return "s64";
    case ffi::BF16: return "bf16";
    case ffi::F16: return "f16";
    case ffi::F32: return "f32";
    case ffi::F64: return "f64";
    case ffi::F8E4M3FN: return "f8e4m3fn";
    default: return "dtype#" + std::to_string(static_cast<int>(dtype));
  }
}

Status CheckOperand(const ffi::AnyBuffer& buffer, const char* who, const char* name,
                    ffi::DataType dtype, const std::vector<std::int64_t>& dims) {
  const auto actual = buffer.dimensions();
  bool ok = buffer.element_type() == dtype && actual.size() == dims.size();
  for (std::size_t i = 0; ok && i < dims.size(); ++i) {
    ok = dims[i] == kAnyExtent || actual[i] == dims[i];
  }
  if (ok) return Status::Ok();
  return Status::InvalidArgument(std::string(who) + ": " + name + " has dtype " +
                                 DtypeName(buffer.element_type()) + " dims " + DimsText(actual) +
                                 "; expected " + DtypeName(dtype) + " dims " + ExtentsText(dims));
}

Status CheckOperands(std::initializer_list<OperandSpec> specs, const char* who) {
  for (const OperandSpec& s : specs) {
    JAX_MLA_RETURN_IF_ERROR(CheckOperand(s.buffer, who, s.name, s.dtype, s.dims));
  }
  return Status::Ok();
}

std::int64_t LeadingExtent(const ffi::AnyBuffer& buffer, std::size_t rank) {
  const auto dims = buffer.dimensions();
  return dims.size() == rank ? dims[0] : -1;
}

std::uint64_t OperandAddress(const ffi::AnyBuffer& buffer) {
  const void* data = buffer.untyped_data();
  if (data == nullptr && buffer.element_count() == 0) data = kNeverRead;
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(data));
}

}  // namespace jax_mla
