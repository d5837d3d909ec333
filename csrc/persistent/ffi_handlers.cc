// Operands: q u8 [N,128,512], q_rope bf16 [N,128,64], kv u8 [R,512], kv_rope bf16 [R,64],
// kv_indptr s32 [N+1], kv_indices s32 [L], sink f32 [128], then the workspace o_acc f32
// [2P,128,512], lse_acc f32 [2P,128], desc s32 [P,8], cnt u32 [143360], arange s32 [M+1].
// Results: out bf16 [N,128,512], lse f32 [N,128] (or [0,128] when return_lse is false: nothing is
// allocated and the kernarg's lse pointer is 0), then the workspace, each aliased to its operand.
#include "persistent/ffi_handlers.h"

#include <exception>
#include <string>
#include <utility>

#include "common/ffi_status.h"
#include "common/launch_plan.h"
#include "persistent/ffi_problem.h"
#include "persistent/host_executor.h"
#include "persistent/plan.h"
#include "xla/ffi/api/ffi.h"

#include "hip/hip_api.h"
#include "hip/launcher.h"

namespace jax_mla {
namespace {

namespace ffi = xla::ffi;
using Operand = ffi::AnyBuffer;
using Result = ffi::Result<ffi::AnyBuffer>;

ffi::Error Fail(const char* what) {
  return ffi::Error(ffi::ErrorCode::kInternal,
                    std::string("jax_mla_persistent_decode_v1: unexpected C++ exception: ") + what);
}

PersistentBuffers Collect(Operand q, Operand q_rope, Operand kv, Operand kv_rope, Operand kv_indptr,
                          Operand kv_indices, Operand sink, Operand o_acc, Operand lse_acc,
                          Operand desc, Operand cnt, Operand arange, Result out, Result lse,
                          Result o_acc_out, Result lse_acc_out, Result desc_out, Result cnt_out,
                          Result arange_out) {
  return PersistentBuffers{q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, o_acc, lse_acc,
                           desc, cnt, arange, *out, *lse, *o_acc_out, *lse_acc_out, *desc_out,
                           *cnt_out, *arange_out};
}

// Checks the buffers and plans the launch; *empty when there are no rows (the handler then
// launches nothing).
Status PlanFromBuffers(const PersistentBuffers& buffers, bool return_lse,
                       std::int32_t num_partitions, LaunchPlan* plan, PersistentHostBounds* bounds,
                       bool* empty) {
  PersistentProblem problem;
  JAX_MLA_RETURN_IF_ERROR(
      BuildPersistentProblem(buffers, return_lse, num_partitions, &problem, bounds));
  *empty = problem.num_rows == 0;
  return *empty ? Status::Ok() : PlanPersistent(problem, plan);
}

ffi::Error CpuImpl(Operand q, Operand q_rope, Operand kv, Operand kv_rope, Operand kv_indptr,
                   Operand kv_indices, Operand sink, Operand o_acc, Operand lse_acc, Operand desc,
                   Operand cnt, Operand arange, Result out, Result lse, Result o_acc_out,
                   Result lse_acc_out, Result desc_out, Result cnt_out, Result arange_out,
                   bool fill_unwritten_nan, std::int32_t num_partitions, bool return_lse) {
  try {
    const PersistentBuffers buffers =
        Collect(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, o_acc, lse_acc, desc, cnt,
                arange, out, lse, o_acc_out, lse_acc_out, desc_out, cnt_out, arange_out);
    LaunchPlan plan;
    PersistentHostBounds bounds;
    bool empty = false;
    const Status s =
        PlanFromBuffers(buffers, return_lse, num_partitions, &plan, &bounds, &empty);
    if (!s.ok() || empty) return ToFfiError(s);
    PersistentHostOptions options;
    options.fill_unwritten_nan = fill_unwritten_nan;
    return ToFfiError(ExecutePersistentOnHost(plan, bounds, options));
  } catch (const std::exception& e) {
    return Fail(e.what());
  } catch (...) {
    return Fail("unknown");
  }
}

// Loads the code object's module on the device before execution, outside any graph capture.
ffi::Error RocmInitialize(std::int32_t device) {
  try {
    return ToFfiError(PrepareKernel(KernelId::kPersistentNmPs, device));
  } catch (const std::exception& e) {
    return Fail(e.what());
  } catch (...) {
    return Fail("unknown");
  }
}

// No allocation, no synchronisation, no host reads of device memory: safe under graph capture.
ffi::Error RocmImpl(hipStream_t stream, std::int32_t device, Operand q, Operand q_rope,
                    Operand kv, Operand kv_rope, Operand kv_indptr, Operand kv_indices,
                    Operand sink, Operand o_acc, Operand lse_acc, Operand desc, Operand cnt,
                    Operand arange, Result out, Result lse, Result o_acc_out, Result lse_acc_out,
                    Result desc_out, Result cnt_out, Result arange_out, std::int32_t num_partitions,
                    bool return_lse) {
  try {
    const PersistentBuffers buffers =
        Collect(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, o_acc, lse_acc, desc, cnt,
                arange, out, lse, o_acc_out, lse_acc_out, desc_out, cnt_out, arange_out);
    LaunchPlan plan;
    PersistentHostBounds bounds;  // shapes only: device memory is never read here
    bool empty = false;
    const Status s =
        PlanFromBuffers(buffers, return_lse, num_partitions, &plan, &bounds, &empty);
    if (!s.ok() || empty) return ToFfiError(s);
    return ToFfiError(LaunchOnHip(plan, stream, device));
  } catch (const std::exception& e) {
    return Fail(e.what());
  } catch (...) {
    return Fail("unknown");
  }
}

template <typename Binding>
auto BindBuffers(Binding binding) {
  return std::move(binding).template Arg<Operand>()  // q
      .template Arg<Operand>()             // q_rope
      .template Arg<Operand>()             // kv
      .template Arg<Operand>()             // kv_rope
      .template Arg<Operand>()             // kv_indptr
      .template Arg<Operand>()             // kv_indices
      .template Arg<Operand>()             // sink
      .template Arg<Operand>()             // o_acc
      .template Arg<Operand>()             // lse_acc
      .template Arg<Operand>()             // desc
      .template Arg<Operand>()             // cnt
      .template Arg<Operand>()             // arange
      .template Ret<Operand>()             // out
      .template Ret<Operand>()             // lse
      .template Ret<Operand>()             // o_acc
      .template Ret<Operand>()             // lse_acc
      .template Ret<Operand>()             // desc
      .template Ret<Operand>()             // cnt
      .template Ret<Operand>();            // arange
}

XLA_FFI_DEFINE_HANDLER(kPersistentCpu, CpuImpl,
                       BindBuffers(ffi::Ffi::Bind())
                           .Attr<bool>("fill_unwritten_nan")
                           .Attr<std::int32_t>("num_partitions")
                           .Attr<bool>("return_lse"));

XLA_FFI_DEFINE_HANDLER(kPersistentRocmInitialize, RocmInitialize,
                       ffi::Ffi::BindInitialize().Ctx<ffi::DeviceOrdinal>(),
                       {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER(kPersistentRocm, RocmImpl,
                       BindBuffers(ffi::Ffi::Bind()
                                       .Ctx<ffi::PlatformStream<hipStream_t>>()
                                       .Ctx<ffi::DeviceOrdinal>())
                           .Attr<std::int32_t>("num_partitions")
                           .Attr<bool>("return_lse"),
                       {ffi::Traits::kCmdBufferCompatible});

}  // namespace

XLA_FFI_Handler* PersistentDecodeCpuHandler() { return kPersistentCpu; }
XLA_FFI_Handler* PersistentDecodeRocmInitializeHandler() { return kPersistentRocmInitialize; }
XLA_FFI_Handler* PersistentDecodeRocmHandler() { return kPersistentRocm; }

}  // namespace jax_mla
