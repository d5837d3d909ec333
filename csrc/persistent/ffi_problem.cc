#include "persistent/ffi_problem.h"

#include <cstdint>
#include <initializer_list>
#include <string>

namespace jax_mla {
namespace {

namespace ffi = xla::ffi;

std::string DimsToString(ffi::Span<const std::int64_t> dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// `expected` entries < 0 match any extent.
Status CheckBuffer(const ffi::AnyBuffer& buffer, ffi::DataType dtype,
                   std::initializer_list<std::int64_t> expected, const char* name) {
  const auto dims = buffer.dimensions();
  bool ok = buffer.element_type() == dtype && dims.size() == expected.size();
  std::size_t i = 0;
  for (std::int64_t e : expected) {
    if (ok && e >= 0 && dims[i] != e) ok = false;
    ++i;
  }
  if (ok) return Status::Ok();
  std::string want = "[";
  i = 0;
  for (std::int64_t e : expected) want += (i++ ? ", " : "") + (e < 0 ? std::string("?") : std::to_string(e));
  return Status::InvalidArgument(
      std::string("jax_mla_persistent_decode_v1: ") + name + " must be dtype " +
      std::to_string(static_cast<int>(dtype)) + " shape " + want + "], got dtype " +
      std::to_string(static_cast<int>(buffer.element_type())) + " shape " + DimsToString(dims));
}

// XLA may hand a zero-element buffer (no kv_indices when every row is empty, an empty kv pool)
// a null address; the plan refuses nulls, so such a buffer gets a dummy that is never read
// (its bounds say 0 entries).
const std::uint64_t kNeverRead[2] = {0, 0};

std::uint64_t Address(const ffi::AnyBuffer& b) {
  if (b.untyped_data() == nullptr && b.element_count() == 0) {
    return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(kNeverRead));
  }
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(b.untyped_data()));
}

}  // namespace

Status BuildPersistentProblem(const PersistentBuffers& b, bool return_lse, int num_partitions,
                              PersistentProblem* problem, PersistentHostBounds* bounds) {
  const std::int64_t n = b.q.dimensions().size() == 3 ? b.q.dimensions()[0] : -1;
  const std::int64_t rows = b.kv.dimensions().size() == 2 ? b.kv.dimensions()[0] : -1;
  const std::int64_t p = num_partitions;
  const std::int64_t h = kPersistentHeads;
  if (n < 0 || rows < 0) {
    return Status::InvalidArgument("jax_mla_persistent_decode_v1: q must be [N, 128, 512] and kv "
                                   "[rows, 512], got q " + DimsToString(b.q.dimensions()) +
                                   " kv " + DimsToString(b.kv.dimensions()));
  }
  if (p < 1 || p > kPersistentMaxPartitions) {
    return Status::InvalidArgument("jax_mla_persistent_decode_v1: num_partitions must be in "
                                   "[1, 1024], got " + std::to_string(p));
  }
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(b.q, ffi::U8, {n, h, 512}, "q"));
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(b.q_rope, ffi::BF16, {n, h, 64}, "q_rope"));
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(b.kv, ffi::U8, {rows, 512}, "kv"));
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(b.kv_rope, ffi::BF16, {rows, 64}, "kv_rope"));
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(b.kv_indptr, ffi::S32, {n + 1}, "kv_indptr"));
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(b.kv_indices, ffi::S32, {-1}, "kv_indices"));
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(b.sink, ffi::F32, {h}, "sink"));
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(b.o_acc, ffi::F32, {2 * p, h, 512}, "o_acc"));
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(b.lse_acc, ffi::F32, {2 * p, h}, "lse_acc"));
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(b.desc, ffi::S32, {p, 8}, "desc"));
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(b.cnt, ffi::U32, {kPersistentCntEntries}, "cnt"));
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(b.arange, ffi::S32, {-1}, "arange"));
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(b.out, ffi::BF16, {n, h, 512}, "out"));
  JAX_MLA_RETURN_IF_ERROR(CheckBuffer(b.lse, ffi::F32, {return_lse ? n : 0, h}, "lse"));
  if (b.arange.dimensions()[0] < n + 1) {
    return Status::InvalidArgument("jax_mla_persistent_decode_v1: the workspace's arange has " +
                                   std::to_string(b.arange.dimensions()[0]) + " entries, N=" +
                                   std::to_string(n) + " needs N+1");
  }
  const struct { const ffi::AnyBuffer& in; const ffi::AnyBuffer& out; const char* name; } aliases[] = {
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
  pr.q = Address(b.q);
  pr.q_rope = Address(b.q_rope);
  pr.kv = Address(b.kv);
  pr.kv_rope = Address(b.kv_rope);
  pr.kv_indptr = Address(b.kv_indptr);
  pr.kv_indices = Address(b.kv_indices);
  pr.sink = Address(b.sink);
  pr.out = Address(b.out);
  pr.lse = return_lse ? Address(b.lse) : 0;
  pr.o_acc = Address(b.o_acc);
  pr.lse_acc = Address(b.lse_acc);
  pr.desc = Address(b.desc);
  pr.cnt = Address(b.cnt);
  pr.arange = Address(b.arange);
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
