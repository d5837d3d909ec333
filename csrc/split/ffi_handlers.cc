// Handlers: FFI buffers -> SplitProblem -> PlanSplit -> host executor (cpu) or HIP (ROCM).
// Operands: q u8 [T,H,512], q_rope bf16 [T,H,64], kv u8 [R,512], kv_rope bf16 [R,64],
// kv_indptr s32 [B+1], kv_indices s32 [L], sink f32 [H], qo_indptr s32 [B+1],
// split_indptr s32 [B+1]. Results: S == 1: out bf16 [T,H,512]; S > 1: partials f32 [T,S,H,512],
// partial_lse f32 [T,S,H], valid_split_count s32 [B].
#include "split/ffi_handlers.h"

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "common/ffi_status.h"
#include "common/launch_plan.h"
#include "hip/hip_api.h"
#include "hip/launcher.h"
#include "split/host_executor.h"
#include "split/plan.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_mla {
namespace {

std::string DimsText(ffi::Span<const std::int64_t> dims) {
  std::string text = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) text += (i ? "," : "") + std::to_string(dims[i]);
  return text + "]";
}

std::string DtypeName(ffi::DataType t) {
  switch (t) {
    case ffi::U8: return "u8";
    case ffi::S8: return "s8";
    case ffi::S32: return "s32";
    case ffi::S64: return "s64";
    case ffi::BF16: return "bf16";
    case ffi::F16: return "f16";
    case ffi::F32: return "f32";
    case ffi::F8E4M3FN: return "f8e4m3fn";
    default: return "dtype#" + std::to_string(static_cast<int>(t));
  }
}

// InvalidArgument naming the operand unless its dtype and dims are as expected.
Status CheckBuffer(const ffi::AnyBuffer& buffer, const char* name, ffi::DataType dtype,
                   const std::vector<std::int64_t>& dims) {
  const auto actual = buffer.dimensions();
  bool ok = buffer.element_type() == dtype && actual.size() == dims.size();
  for (std::size_t i = 0; ok && i < dims.size(); ++i) ok = actual[i] == dims[i];
  if (ok) return Status::Ok();
  std::string want = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) want += (i ? "," : "") + std::to_string(dims[i]);
  return Status::InvalidArgument(std::string("jax_mla_split_decode_v1: ") + name + " has dtype " +
                                 DtypeName(buffer.element_type()) + " dims " + DimsText(actual) +
                                 "; expected " + DtypeName(dtype) + " dims " + want + "]");
}

// A zero-element buffer may come with a null address (e.g. no KV indices when every sequence is
// empty); the plan refuses null, and such a buffer is never read, so it gets a dummy address.
alignas(64) const std::uint8_t kNeverRead[64] = {};

std::uint64_t Address(const ffi::AnyBuffer& b) {
  const void* data = b.untyped_data();
  if (data == nullptr && b.element_count() == 0) data = kNeverRead;
  return reinterpret_cast<std::uintptr_t>(data);
}

struct Operands {
  ffi::AnyBuffer q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, qo_indptr, split_indptr;
};

// Checks every operand and result, and fills the problem (addresses, sizes) and the bounds.
Status BuildProblem(const Operands& in, const ffi::RemainingRets& rets, std::int32_t num_kv_splits,
                    std::int32_t tokens_per_seq, SplitProblem* problem, SplitHostBounds* bounds) {
  const auto q_dims = in.q.dimensions();
  if (q_dims.size() != 3) {
    return Status::InvalidArgument("jax_mla_split_decode_v1: q must be [T, H, 512], got " +
                                   DimsText(q_dims));
  }
  if (num_kv_splits < 1) {
    return Status::InvalidArgument("jax_mla_split_decode_v1: num_kv_splits = " +
                                   std::to_string(num_kv_splits) + ", must be >= 1");
  }
  const std::int64_t T = q_dims[0], H = q_dims[1], S = num_kv_splits;
  const std::int64_t R = in.kv.dimensions().size() == 2 ? in.kv.dimensions()[0] : -1;
  const std::int64_t L = in.kv_indices.dimensions().size() == 1 ? in.kv_indices.dimensions()[0] : -1;
  const std::int64_t B = in.kv_indptr.dimensions().size() == 1 ? in.kv_indptr.dimensions()[0] - 1 : -1;
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(in.q, "q (operand 0)", ffi::U8, {T, H, 512}));
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(in.q_rope, "q_rope (operand 1)", ffi::BF16, {T, H, 64}));
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(in.kv, "kv (operand 2)", ffi::U8, {R, 512}));
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(in.kv_rope, "kv_rope (operand 3)", ffi::BF16, {R, 64}));
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(in.kv_indptr, "kv_indptr (operand 4)", ffi::S32, {B + 1}));
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(in.kv_indices, "kv_indices (operand 5)", ffi::S32, {L}));
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(in.sink, "sink (operand 6)", ffi::F32, {H}));
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(in.qo_indptr, "qo_indptr (operand 7)", ffi::S32, {B + 1}));
  JAX_MLA_RETURN_IF_ERROR(
      CheckBuffer(in.split_indptr, "split_indptr (operand 8)", ffi::S32, {B + 1}));
  if (T != B * tokens_per_seq) {
    return Status::InvalidArgument("jax_mla_split_decode_v1: q has " + std::to_string(T) +
                                   " tokens, expected num_seqs * tokens_per_seq = " +
                                   std::to_string(B) + " * " + std::to_string(tokens_per_seq));
  }
  const std::size_t want_rets = S == 1 ? 1 : 3;
  if (rets.size() != want_rets) {
    return Status::InvalidArgument("jax_mla_split_decode_v1: " + std::to_string(rets.size()) +
                                   " results for num_kv_splits = " + std::to_string(S) +
                                   ", expected " + std::to_string(want_rets));
  }
  std::uint64_t results[3] = {0, 0, 0};
  const char* names[3] = {S == 1 ? "out (result 0)" : "partials (result 0)",
                          "partial_lse (result 1)", "valid_split_count (result 2)"};
  const ffi::DataType types[3] = {S == 1 ? ffi::BF16 : ffi::F32, ffi::F32, ffi::S32};
  const std::vector<std::int64_t> shapes[3] = {
      S == 1 ? std::vector<std::int64_t>{T, H, 512} : std::vector<std::int64_t>{T, S, H, 512},
      {T, S, H}, {B}};
  for (std::size_t i = 0; i < want_rets; ++i) {
    auto ret = rets.get<ffi::AnyBuffer>(i);
    if (!ret.has_value()) {
      return Status::InvalidArgument(std::string("jax_mla_split_decode_v1: cannot decode ") +
                                     names[i] + ": " + ret.error().message());
    }
    JAX_MLA_RETURN_IF_ERROR(CheckBuffer(**ret, names[i], types[i], shapes[i]));
    results[i] = Address(**ret);
  }

  SplitProblem p;
  p.out = results[0];
  p.partial_lse = results[1];
  p.valid_split_count = results[2];
  p.q = Address(in.q);
  p.q_rope = Address(in.q_rope);
  p.kv = Address(in.kv);
  p.kv_rope = Address(in.kv_rope);
  p.kv_indptr = Address(in.kv_indptr);
  p.kv_indices = Address(in.kv_indices);
  p.qo_indptr = Address(in.qo_indptr);
  p.split_indptr = Address(in.split_indptr);
  p.sink = Address(in.sink);
  p.num_seqs = B;
  p.num_heads = H;
  p.tokens_per_seq = tokens_per_seq;
  p.num_kv_splits = S;
  *problem = p;
  *bounds = SplitHostBounds{T, H, B, S, R, L};
  return Status::Ok();
}

ffi::Error SplitDecodeCpu(ffi::AnyBuffer q, ffi::AnyBuffer q_rope, ffi::AnyBuffer kv,
                          ffi::AnyBuffer kv_rope, ffi::AnyBuffer kv_indptr,
                          ffi::AnyBuffer kv_indices, ffi::AnyBuffer sink,
                          ffi::AnyBuffer qo_indptr, ffi::AnyBuffer split_indptr,
                          ffi::RemainingRets rets, std::int32_t num_kv_splits,
                          std::int32_t tokens_per_seq, bool fill_unwritten_nan) {
  try {
    const Operands in{q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, qo_indptr, split_indptr};
    SplitProblem problem;
    SplitHostBounds bounds;
    Status s = BuildProblem(in, rets, num_kv_splits, tokens_per_seq, &problem, &bounds);
    if (!s.ok()) return ToFfiError(s);
    if (problem.num_seqs == 0) return ffi::Error::Success();  // empty batch: nothing to launch
    LaunchPlan plan;
    s = PlanSplit(problem, &plan);
    if (!s.ok()) return ToFfiError(s);
    SplitHostOptions options;
    options.fill_unwritten_nan = fill_unwritten_nan;
    return ToFfiError(ExecuteSplitOnHost(plan, bounds, options));
  } catch (const std::exception& e) {  // e.g. std::thread or bad_alloc: never cross the boundary
    return ffi::Error::Internal(std::string("jax_mla_split_decode_v1 (cpu): ") + e.what());
  }
}

ffi::Error SplitDecodeRocmInitialize(std::int32_t device) {
  try {
    return ToFfiError(PrepareKernel(KernelId::kSplitNm, device));
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("jax_mla_split_decode_v1 (initialize): ") + e.what());
  }
}

// Allocates nothing, synchronizes nothing, reads no device memory: only addresses and shapes.
ffi::Error SplitDecodeRocmExecute(hipStream_t stream, std::int32_t device, ffi::AnyBuffer q,
                                  ffi::AnyBuffer q_rope, ffi::AnyBuffer kv, ffi::AnyBuffer kv_rope,
                                  ffi::AnyBuffer kv_indptr, ffi::AnyBuffer kv_indices,
                                  ffi::AnyBuffer sink, ffi::AnyBuffer qo_indptr,
                                  ffi::AnyBuffer split_indptr, ffi::RemainingRets rets,
                                  std::int32_t num_kv_splits, std::int32_t tokens_per_seq) {
  try {
    const Operands in{q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, qo_indptr, split_indptr};
    SplitProblem problem;
    SplitHostBounds bounds;
    Status s = BuildProblem(in, rets, num_kv_splits, tokens_per_seq, &problem, &bounds);
    if (!s.ok()) return ToFfiError(s);
    if (problem.num_seqs == 0) return ffi::Error::Success();
    LaunchPlan plan;
    s = PlanSplit(problem, &plan);
    if (!s.ok()) return ToFfiError(s);
    return ToFfiError(LaunchOnHip(plan, stream, device));
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("jax_mla_split_decode_v1 (rocm): ") + e.what());
  }
}

}  // namespace
}  // namespace jax_mla

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMlaSplitDecodeCpu, jax_mla::SplitDecodeCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // q_rope
                                  .Arg<ffi::AnyBuffer>()  // kv
                                  .Arg<ffi::AnyBuffer>()  // kv_rope
                                  .Arg<ffi::AnyBuffer>()  // kv_indptr
                                  .Arg<ffi::AnyBuffer>()  // kv_indices
                                  .Arg<ffi::AnyBuffer>()  // sink
                                  .Arg<ffi::AnyBuffer>()  // qo_indptr
                                  .Arg<ffi::AnyBuffer>()  // split_indptr
                                  .RemainingRets()
                                  .Attr<std::int32_t>("num_kv_splits")
                                  .Attr<std::int32_t>("tokens_per_seq")
                                  .Attr<bool>("fill_unwritten_nan"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMlaSplitDecodeRocmInitialize, jax_mla::SplitDecodeRocmInitialize,
                              ffi::Ffi::BindInitialize().Ctx<ffi::DeviceOrdinal>(),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMlaSplitDecodeRocmExecute, jax_mla::SplitDecodeRocmExecute,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<hipStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // q_rope
                                  .Arg<ffi::AnyBuffer>()  // kv
                                  .Arg<ffi::AnyBuffer>()  // kv_rope
                                  .Arg<ffi::AnyBuffer>()  // kv_indptr
                                  .Arg<ffi::AnyBuffer>()  // kv_indices
                                  .Arg<ffi::AnyBuffer>()  // sink
                                  .Arg<ffi::AnyBuffer>()  // qo_indptr
                                  .Arg<ffi::AnyBuffer>()  // split_indptr
                                  .RemainingRets()
                                  .Attr<std::int32_t>("num_kv_splits")
                                  .Attr<std::int32_t>("tokens_per_seq"),
                              {ffi::Traits::kCmdBufferCompatible});
