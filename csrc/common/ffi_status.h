// Status -> ffi::Error, for handlers. Handlers return errors; nothing throws across the FFI boundary.
#ifndef JAX_MLA_COMMON_FFI_STATUS_H_
#define JAX_MLA_COMMON_FFI_STATUS_H_

#include "common/status.h"
#include "xla/ffi/api/ffi.h"

namespace jax_mla {

inline xla::ffi::Error ToFfiError(const Status& s) {
  namespace ffi = xla::ffi;
  switch (s.code()) {
    case StatusCode::kOk: return ffi::Error::Success();
    case StatusCode::kInvalidArgument: return ffi::Error(ffi::ErrorCode::kInvalidArgument, s.message());
    case StatusCode::kFailedPrecondition: return ffi::Error(ffi::ErrorCode::kFailedPrecondition, s.message());
    case StatusCode::kNotFound: return ffi::Error(ffi::ErrorCode::kNotFound, s.message());
    case StatusCode::kUnavailable: return ffi::Error(ffi::ErrorCode::kUnavailable, s.message());
    case StatusCode::kInternal: return ffi::Error(ffi::ErrorCode::kInternal, s.message());
  }
  return ffi::Error(ffi::ErrorCode::kInternal, s.message());
}

}  // namespace jax_mla

#endif  // JAX_MLA_COMMON_FFI_STATUS_H_
