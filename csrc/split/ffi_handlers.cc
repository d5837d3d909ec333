// Handlers: FFI buffers -> SplitProblem -> PlanSplit -> host executor (cpu) or HIP (ROCM).
// Operands: q u8 [T,H,512], q_rope bf16 [T,H,64], kv u8 [R,512], kv_rope bf16 [R,64],
// kv_indptr s32 [B+1], kv_indices s32 [L], sink f32 [H], qo_indptr s32 [B+1],
// split_indptr s32 [B+1]. Results: S == 1: out bf16 [T,H,512]; S > 1: partials f32 [T,S,H,512],
// partial_lse f32 [T,S,H], valid_split_count s32 [B]. The cpu handler with merge_in_executor
// first has the merged out bf16 [T,H,512] and lse f32 [T,H], then (S > 1) the kernel's three
// (with S == 1 the merged out is the kernel's out).
#include "split/ffi_handlers.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "common/ffi_operands.h"
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

constexpr char kWho[] = "jax_mla_split_decode_v1";

struct Operands {
  ffi::AnyBuffer q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, qo_indptr, split_indptr;
};

// Checks every operand and result, and fills the problem (addresses, sizes) and the bounds.
// merge: the cpu handler's merged results come first (*merge gets their addresses).
Status BuildProblem(const Operands& in, const ffi::RemainingRets& rets, std::int32_t num_kv_splits,
                    std::int32_t tokens_per_seq, SplitHostMerge* merge, SplitProblem* problem,
                    SplitHostBounds* bounds) {
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
  const std::int64_t R = LeadingExtent(in.kv, 2);
  const std::int64_t L = LeadingExtent(in.kv_indices, 1);
  const std::int64_t B = std::max<std::int64_t>(LeadingExtent(in.kv_indptr, 1), 0) - 1;
  JAX_MLA_RETURN_IF_ERROR(CheckOperands({
      {in.q, "q (operand 0)", ffi::U8, {T, H, 512}},
      {in.q_rope, "q_rope (operand 1)", ffi::BF16, {T, H, 64}},
      {in.kv, "kv (operand 2)", ffi::U8, {R, 512}},
      {in.kv_rope, "kv_rope (operand 3)", ffi::BF16, {R, 64}},
      {in.kv_indptr, "kv_indptr (operand 4)", ffi::S32, {B + 1}},
      {in.kv_indices, "kv_indices (operand 5)", ffi::S32, {L}},
      {in.sink, "sink (operand 6)", ffi::F32, {H}},
      {in.qo_indptr, "qo_indptr (operand 7)", ffi::S32, {B + 1}},
      {in.split_indptr, "split_indptr (operand 8)", ffi::S32, {B + 1}}}, kWho));
  if (T != B * tokens_per_seq) {
    return Status::InvalidArgument("jax_mla_split_decode_v1: q has " + std::to_string(T) +
                                   " tokens, expected num_seqs * tokens_per_seq = " +
                                   std::to_string(B) + " * " + std::to_string(tokens_per_seq));
  }
  struct Result {
    const char* name;
    ffi::DataType type;
    std::vector<std::int64_t> shape;
  };
  std::vector<Result> want;
  if (merge != nullptr) {
    want.push_back({"merged out", ffi::BF16, {T, H, 512}});
    want.push_back({"merged lse", ffi::F32, {T, H}});
  }
  if (S == 1 && merge == nullptr) want.push_back({"out", ffi::BF16, {T, H, 512}});
  if (S > 1) {
    want.push_back({"partials", ffi::F32, {T, S, H, 512}});
    want.push_back({"partial_lse", ffi::F32, {T, S, H}});
    want.push_back({"valid_split_count", ffi::S32, {B}});
  }
  if (rets.size() != want.size()) {
    return Status::InvalidArgument("jax_mla_split_decode_v1: " + std::to_string(rets.size()) +
                                   " results for num_kv_splits = " + std::to_string(S) +
                                   (merge ? " merged in the executor" : "") + ", expected " +
                                   std::to_string(want.size()));
  }
  std::vector<std::uint64_t> addresses;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const std::string name = std::string(want[i].name) + " (result " + std::to_string(i) + ")";
    auto ret = rets.get<ffi::AnyBuffer>(i);
    if (!ret.has_value()) {
      return Status::InvalidArgument("jax_mla_split_decode_v1: cannot decode " + name + ": " +
                                     ret.error().message());
    }
    JAX_MLA_RETURN_IF_ERROR(CheckOperand(**ret, kWho, name.c_str(), want[i].type, want[i].shape));
    addresses.push_back(OperandAddress(**ret));
  }
  // The kernel's results: after the merged ones; with S == 1 and merging, the merged out.
  std::uint64_t results[3] = {0, 0, 0};
  if (merge != nullptr) {
    merge->out = reinterpret_cast<std::uint16_t*>(static_cast<std::uintptr_t>(addresses[0]));
    merge->lse = reinterpret_cast<float*>(static_cast<std::uintptr_t>(addresses[1]));
    if (S == 1) results[0] = addresses[0];
  }
  const std::size_t first = merge != nullptr ? 2 : 0;
  for (std::size_t i = first; i < addresses.size(); ++i) results[i - first] = addresses[i];

  SplitProblem p;
  p.out = results[0];
  p.partial_lse = results[1];
  p.valid_split_count = results[2];
  p.q = OperandAddress(in.q);
  p.q_rope = OperandAddress(in.q_rope);
  p.kv = OperandAddress(in.kv);
  p.kv_rope = OperandAddress(in.kv_rope);
  p.kv_indptr = OperandAddress(in.kv_indptr);
  p.kv_indices = OperandAddress(in.kv_indices);
  p.qo_indptr = OperandAddress(in.qo_indptr);
  p.split_indptr = OperandAddress(in.split_indptr);
  p.sink = OperandAddress(in.sink);
  p.num_seqs = B;
  p.num_heads = H;
  p.tokens_per_seq = tokens_per_seq;
  p.num_kv_splits = S;
  *problem = p;
  *bounds = SplitHostBounds{T, H, B, S, R, L};
  return Status::Ok();
}

// Checks the buffers and plans the launch; *empty when the batch has no sequences (the handler
// then launches nothing).
Status PlanFromBuffers(const Operands& in, const ffi::RemainingRets& rets,
                       std::int32_t num_kv_splits, std::int32_t tokens_per_seq,
                       SplitHostMerge* merge, LaunchPlan* plan, SplitHostBounds* bounds,
                       bool* empty) {
  SplitProblem problem;
  JAX_MLA_RETURN_IF_ERROR(
      BuildProblem(in, rets, num_kv_splits, tokens_per_seq, merge, &problem, bounds));
  *empty = problem.num_seqs == 0;
  return *empty ? Status::Ok() : PlanSplit(problem, plan);
}

// The cpu handler's attributes. merge_in_executor is optional: a call lowered before it existed
// (a serialized jax.export, say) asks for the kernel's own results, which it still gets.
struct CpuAttrs {
  std::int32_t num_kv_splits = 0, tokens_per_seq = 0;
  bool fill_unwritten_nan = false, merge_in_executor = false;
};

ffi::ErrorOr<CpuAttrs> DecodeCpuAttrs(const ffi::Dictionary& attrs) {
  const auto invalid = [](const ffi::Error& error) {
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        std::string("jax_mla_split_decode_v1 (cpu): attribute: ") + error.message()));
  };
  auto splits = attrs.get<std::int32_t>("num_kv_splits");
  if (!splits.has_value()) return invalid(splits.error());
  auto tokens = attrs.get<std::int32_t>("tokens_per_seq");
  if (!tokens.has_value()) return invalid(tokens.error());
  auto fill = attrs.get<bool>("fill_unwritten_nan");
  if (!fill.has_value()) return invalid(fill.error());
  CpuAttrs a{*splits, *tokens, *fill, false};
  if (attrs.contains("merge_in_executor")) {
    auto merge = attrs.get<bool>("merge_in_executor");
    if (!merge.has_value()) return invalid(merge.error());
    a.merge_in_executor = *merge;
  }
  return a;
}

ffi::Error SplitDecodeCpu(ffi::AnyBuffer q, ffi::AnyBuffer q_rope, ffi::AnyBuffer kv,
                          ffi::AnyBuffer kv_rope, ffi::AnyBuffer kv_indptr,
                          ffi::AnyBuffer kv_indices, ffi::AnyBuffer sink,
                          ffi::AnyBuffer qo_indptr, ffi::AnyBuffer split_indptr,
                          ffi::RemainingRets rets, ffi::Dictionary attr_dict) {
  try {
    const ffi::ErrorOr<CpuAttrs> attrs = DecodeCpuAttrs(attr_dict);
    if (!attrs.has_value()) return attrs.error();
    const auto [num_kv_splits, tokens_per_seq, fill_unwritten_nan, merge_in_executor] = *attrs;
    const Operands in{q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, qo_indptr, split_indptr};
    LaunchPlan plan;
    SplitHostBounds bounds;
    SplitHostOptions options;
    bool empty = false;
    const Status s = PlanFromBuffers(in, rets, num_kv_splits, tokens_per_seq,
                                     merge_in_executor ? &options.merge : nullptr, &plan, &bounds,
                                     &empty);
    if (!s.ok() || empty) return ToFfiError(s);
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
    LaunchPlan plan;
    SplitHostBounds bounds;
    bool empty = false;
    const Status s = PlanFromBuffers(in, rets, num_kv_splits, tokens_per_seq, nullptr, &plan,
                                     &bounds, &empty);
    if (!s.ok() || empty) return ToFfiError(s);
    return ToFfiError(LaunchOnHip(plan, stream, device));
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("jax_mla_split_decode_v1 (rocm): ") + e.what());
  }
}

// The nine operands and the results, bound alike by the cpu and ROCm execute handlers.
template <typename Binding>
auto BindBuffers(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()  // q
      .template Arg<ffi::AnyBuffer>()  // q_rope
      .template Arg<ffi::AnyBuffer>()  // kv
      .template Arg<ffi::AnyBuffer>()  // kv_rope
      .template Arg<ffi::AnyBuffer>()  // kv_indptr
      .template Arg<ffi::AnyBuffer>()  // kv_indices
      .template Arg<ffi::AnyBuffer>()  // sink
      .template Arg<ffi::AnyBuffer>()  // qo_indptr
      .template Arg<ffi::AnyBuffer>()  // split_indptr
      .RemainingRets();
}

}  // namespace
}  // namespace jax_mla

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMlaSplitDecodeCpu, jax_mla::SplitDecodeCpu,
                              jax_mla::BindBuffers(ffi::Ffi::Bind())
                                  .Attrs<ffi::Dictionary>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMlaSplitDecodeRocmInitialize, jax_mla::SplitDecodeRocmInitialize,
                              ffi::Ffi::BindInitialize().Ctx<ffi::DeviceOrdinal>(),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMlaSplitDecodeRocmExecute, jax_mla::SplitDecodeRocmExecute,
                              jax_mla::BindBuffers(ffi::Ffi::Bind()
                                                       .Ctx<ffi::PlatformStream<hipStream_t>>()
                                                       .Ctx<ffi::DeviceOrdinal>())
                                  .Attr<std::int32_t>("num_kv_splits")
                                  .Attr<std::int32_t>("tokens_per_seq"),
                              {ffi::Traits::kCmdBufferCompatible});
