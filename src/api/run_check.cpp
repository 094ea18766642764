// Checked mode (issue 9): its default, and check_gqa_run / check_mla_run, which turn the record a
// checked kernel left in the workspace (kernels/common/check_record.cuh) into a deca::Error that
// names the argument, the entry, the bound and the value, as the host-side checks do.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "api/check.hpp"
#include "cuda/backend.hpp"
#include "deca/checked.hpp"
#include "deca/error.hpp"
#include "deca/gqa.hpp"
#include "deca/mla.hpp"

namespace deca {

bool checked_by_default() {
  // Read on every call, not cached: deca's tests set the variable during static initialisation
  // (tests/common/checked_on.cpp), which may come after another file's first GqaConfig.
  if (const char* env = std::getenv("DECA_CHECKED")) {
    if (std::strcmp(env, "1") == 0) return true;
    if (std::strcmp(env, "0") == 0) return false;
  }
#ifdef NDEBUG
  return false;
#else
  return true;
#endif
}

namespace {

constexpr const char* kFound = " (found by the checked GPU run)";

std::string s(std::int64_t v) { return std::to_string(v); }

// Where a checked plan keeps its record: the workspace's last kCheckBytes bytes.
const void* record_of(const char* check_fn, std::size_t workspace_bytes, const void* workspace) {
  if (workspace_bytes < kCheckBytes) {
    api::fail(check_fn, "plan.workspace_bytes",
              ">= " + s(static_cast<std::int64_t>(kCheckBytes)) +
                  " (a checked plan keeps its record in the workspace's last bytes)",
              s(static_cast<std::int64_t>(workspace_bytes)));
  }
  if (workspace == nullptr) {
    api::fail(check_fn, "workspace", "the workspace the checked runs used", "nullptr");
  }
  return static_cast<const unsigned char*>(workspace) + (workspace_bytes - kCheckBytes);
}

}  // namespace

void check_gqa_run(const GqaPlan& plan, const void* workspace, void* stream) {
  constexpr const char* kCheckFn = "check_gqa_run";
  const GqaConfig& c = plan.config;
  if (!c.checked || c.device.kind != DeviceKind::kCUDA) return;
  CheckRecord rec{};
  const void* record = record_of(kCheckFn, plan.workspace_bytes, workspace);
  if (!cuda::take_check_record(c.device.index, record, stream, rec, kCheckFn)) return;
  constexpr const char* fn = "gqa_decode";
  if (rec.kind == kCheckPageId) {
    throw Error(std::string(fn) + ": page_table[" + s(rec.request) + "][" + s(rec.position) +
                "]: expected a page id in [0, " + s(rec.hi) + "), got " + s(rec.value) + kFound);
  }
  if (rec.kind == kCheckSeqLen) {
    throw Error(std::string(fn) + ": seq_lens[" + s(rec.request) +
                "]: expected 0 or a length in [q_len, " + s(rec.hi) +
                "] (q_len..min(max_pages * page_size, plan.config.max_seq_len)), got " +
                s(rec.value) + kFound);
  }
  if (rec.kind == kCheckPosition) {
    const std::string where = rec.position == 1
                                  ? "positions[" + s(rec.request) + "][" + s(rec.token) + "]"
                                  : "seq_lens[" + s(rec.request) + "] - q_len + " + s(rec.token) +
                                        " (the position of new token " + s(rec.token) + ")";
    throw Error(std::string(fn) + ": " + where + ": expected a position in [0, " + s(rec.hi) +
                ") (cos_sin_cache's rows), got " + s(rec.value) + kFound);
  }
  throw Error(std::string(kCheckFn) + ": workspace: expected a check record of a GQA run, got kind " +
              s(rec.kind) + " (a workspace shared with another plan?)");
}

namespace {

// A dense run's record: the kernels read block_table and cache_seqlens where the sparse run
// reads indices and topk_length (the lengths are the scheduler's topk_length, capped at
// max_seq_len), so a length is reported under either kind.
[[noreturn]] void throw_dense_record(const CheckRecord& rec) {
  const std::string fn = "mla_decode_dense";
  if (rec.kind == kCheckPageId) {
    throw Error(fn + ": block_table[" + s(rec.request) + "][" + s(rec.position) +
                "]: expected a block id in [0, " + s(rec.hi) + ") (kv_cache's num_blocks), got " +
                s(rec.value) + kFound);
  }
  if (rec.kind == kCheckSeqLen || rec.kind == kCheckTopkLength) {
    throw Error(fn + ": cache_seqlens[" + s(rec.request) + "]: expected a length in [0, " +
                s(rec.hi) + "] (min(plan.config.max_seq_len, block_table's columns * page_size)), got " +
                s(rec.value) + kFound);
  }
  if (rec.kind == kCheckSchedule) {
    throw Error(fn + ": reuse_schedule: expected the workspace to hold the schedule of this "
                "call's shape, got one of batch " + s(rec.request) + ", q_len " + s(rec.token) +
                ", " + s(rec.value) + " partitions (nothing was written; out and lse hold NaN)" +
                kFound);
  }
  throw Error("check_mla_run: workspace: expected a check record of an MLA dense run, got kind " +
              s(rec.kind) + " (a workspace shared with another plan?)");
}

}  // namespace

void check_mla_run(const MlaPlan& plan, const void* workspace, void* stream) {
  constexpr const char* kCheckFn = "check_mla_run";
  const MlaConfig& c = plan.config;
  if (!c.checked || c.device.kind != DeviceKind::kCUDA) return;
  CheckRecord rec{};
  const void* record = record_of(kCheckFn, plan.workspace_bytes, workspace);
  if (!cuda::take_check_record(c.device.index, record, stream, rec, kCheckFn)) return;
  if (!c.sparse) throw_dense_record(rec);
  constexpr const char* fn = "mla_decode_sparse";
  if (rec.kind == kCheckIndex) {
    throw Error(std::string(fn) + ": indices[" + s(rec.request) + "][" + s(rec.token) + "][" +
                s(rec.position) + "]: expected -1 or a token id in [0, " + s(rec.hi) +
                ") (num_blocks * page_size), got " + s(rec.value) + kFound);
  }
  if (rec.kind == kCheckTopkLength) {
    throw Error(std::string(fn) + ": topk_length[" + s(rec.request) + "]: expected a length in [0, " +
                s(rec.hi) + "] (topk), got " + s(rec.value) + kFound);
  }
  if (rec.kind == kCheckExtraIndex) {
    throw Error(std::string(fn) + ": extra_indices[" + s(rec.request) + "][" + s(rec.token) + "][" +
                s(rec.position) + "]: expected -1 or a token id in [0, " + s(rec.hi) +
                ") (extra_kv_cache's num_blocks * extra_page_size), got " + s(rec.value) + kFound);
  }
  if (rec.kind == kCheckExtraTopkLength) {
    throw Error(std::string(fn) + ": extra_topk_length[" + s(rec.request) + "]: expected a length in [0, " +
                s(rec.hi) + "] (extra_topk), got " + s(rec.value) + kFound);
  }
  if (rec.kind == kCheckSchedule) {
    throw Error(std::string(fn) + ": reuse_schedule: expected the workspace to hold the schedule of "
                "this call's shape, got one of batch " + s(rec.request) + ", q_len " + s(rec.token) +
                ", topk " + s(rec.position) + ", " + s(rec.value) + " partitions" +
                (rec.hi != 0 ? ", with topk_length" : ", without topk_length") +
                // The record has no room for the second cache's list, which the kernels compare too.
                (c.extra_topk > 0 ? " (or another extra_topk / extra_topk_length than this call's)" : "") +
                " (nothing was written; out and lse hold NaN)" + kFound);
  }
  throw Error(std::string(kCheckFn) + ": workspace: expected a check record of an MLA sparse run, "
              "got kind " + s(rec.kind) + " (a workspace shared with another plan?)");
}

}  // namespace deca
