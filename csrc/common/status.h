// A small status type for the pure C++ layers (plan, executors, launcher), which must not depend
// on XLA. Handlers turn it into an ffi::Error with ToFfiError (ffi_status.h).
#ifndef JAX_MLA_COMMON_STATUS_H_
#define JAX_MLA_COMMON_STATUS_H_

#include <string>
#include <utility>

namespace jax_mla {

enum class StatusCode { kOk = 0, kInvalidArgument, kFailedPrecondition, kNotFound, kInternal, kUnavailable };

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace jax_mla

#define JAX_MLA_RETURN_IF_ERROR(expr)        \
  do {                                       \
    ::jax_mla::Status _jax_mla_s = (expr);   \
    if (!_jax_mla_s.ok()) return _jax_mla_s; \
  } while (0)

#endif  // JAX_MLA_COMMON_STATUS_H_
