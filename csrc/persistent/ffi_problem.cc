#include "persistent/ffi_problem.h"

#include <cstdint>
#include <string>
#include <vector>

#include "common/ffi_operands.h"

namespace jax_mla {
namespace {

namespace ffi = xla::ffi;

constexpr char kWho[] = "jax_mla_persistent_decode_v1";

}  // namespace

Status BuildPersistentProblem(const PersistentBuffers& b, bool return_lse, int num_partitions,
                              PersistentProblem* problem, PersistentHostBounds* bounds) {
  const std::int64_t n = LeadingExtent(b.q, 3);
  const std::int64_t rows = LeadingExtent(b.kv, 2);
  const std::int64_t p = num_partitions;
  const std::int64_t h = kPersistentHeads;
  if (n < 0 || rows < 0) {
    return Status::InvalidArgument("jax_mla_persistent_decode_v1: q must be [N, 128, 512] and kv "
                                   "[rows, 512], got q " + DimsText(b.q.dimensions()) +
                                   " kv " + DimsText(b.kv.dimensions()));
  }
  if (p < 1 || p > kPersistentMaxPartitions) {
    return Status::InvalidArgument("jax_mla_persistent_decode_v1: num_partitions must be in "
                                   "[1, 1024], got " + std::to_string(p));
  }
  JAX_MLA_RETURN_IF_ERROR(CheckOperands({
      {b.q, "q (operand 0)", ffi::U8, {n, h, 512}},
      {b.q_rope, "q_rope (operand 1)", ffi::BF16, {n, h, 64}},
      {b.kv, "kv (operand 2)", ffi::U8, {rows, 512}},
      {b.kv_rope, "kv_rope (operand 3)", ffi::BF16, {rows, 64}},
      {b.kv_indptr, "kv_indptr (operand 4)", ffi::S32, {n + 1}},
      {b.kv_indices, "kv_indices (operand 5)", ffi::S32, {kAnyExtent}},
      {b.sink, "sink (operand 6)", ffi::F32, {h}},
      {b.o_acc, "o_acc (operand 7)", ffi::F32, {2 * p, h, 512}},
      {b.lse_acc, "lse_acc (operand 8)", ffi::F32, {2 * p, h}},
      {b.desc, "desc (operand 9)", ffi::S32, {p, 8}},
      {b.cnt, "cnt (operand 10)", ffi::U32, {kPersistentCntEntries}},
      {b.arange, "arange (operand 11)", ffi::S32, {kAnyExtent}},
      {b.out, "out (result 0)", ffi::BF16, {n, h, 512}},
      {b.lse, "lse (result 1)", ffi::F32, {return_lse ? n : 0, h}}}, kWho));
  if (b.arange.dimensions()[0] < n + 1) {
    return Status::InvalidArgument("jax_mla_persistent_decode_v1: the workspace's arange has " +
                                   std::to_string(b.arange.dimensions()[0]) + " entries, N=" +
                                   std::to_string(n) + " needs N+1");
  }
  const struct {
    const ffi::AnyBuffer& in;
    const ffi::AnyBuffer& out;
    const char* name;
  } aliases[] = {
      {b.o_acc, b.o_acc_out, "o_acc"}, {b.lse_acc, b.lse_acc_out, "lse_acc"},
      {b.desc, b.desc_out, "desc"}, {b.cnt, b.cnt_out, "cnt"}, {b.arange, b.arange_out, "arange"}};
  for (const auto& a : aliases) {
    if (a.in.untyped_data() != a.out.untyped_data()) {
      return Status::Internal(std::string("jax_mla_persistent_decode_v1: the workspace result ") +
                              a.name + " does not alias its operand (lowering without "
                              "operand_output_aliases?)");
    }
  }

  PersistentProblem pr;
  pr.q = OperandAddress(b.q);
  pr.q_rope = OperandAddress(b.q_rope);
  pr.kv = OperandAddress(b.kv);
  pr.kv_rope = OperandAddress(b.kv_rope);
  pr.kv_indptr = OperandAddress(b.kv_indptr);
  pr.kv_indices = OperandAddress(b.kv_indices);
  pr.sink = OperandAddress(b.sink);
  pr.out = OperandAddress(b.out);
  pr.lse = return_lse ? OperandAddress(b.lse) : 0;
  pr.o_acc = OperandAddress(b.o_acc);
  pr.lse_acc = OperandAddress(b.lse_acc);
  pr.desc = OperandAddress(b.desc);
  pr.cnt = OperandAddress(b.cnt);
  pr.arange = OperandAddress(b.arange);
  pr.num_rows = static_cast<std::uint32_t>(n > kPersistentMaxRows ? kPersistentMaxRows + 1 : n);
  pr.num_partitions = static_cast<std::uint32_t>(p);
  pr.num_heads = static_cast<std::uint32_t>(b.q.dimensions()[1]);
  pr.return_lse = return_lse;
  *problem = pr;

  PersistentHostBounds hb;
  hb.q_rows = static_cast<std::uint64_t>(n);
  hb.kv_rows = static_cast<std::uint64_t>(rows);
  hb.kv_indptr_len = static_cast<std::uint64_t>(n + 1);
  hb.kv_indices_len = static_cast<std::uint64_t>(b.kv_indices.dimensions()[0]);
  hb.out_rows = static_cast<std::uint64_t>(n);
  hb.lse_rows = return_lse ? static_cast<std::uint64_t>(n) : 0;
  hb.acc_slots = static_cast<std::uint64_t>(2 * p);
  hb.desc_rows = static_cast<std::uint64_t>(p);
  hb.cnt_len = kPersistentCntEntries;
  hb.arange_len = static_cast<std::uint64_t>(b.arange.dimensions()[0]);
  *bounds = hb;
  return Status::Ok();
}

}  // namespace jax_mla
