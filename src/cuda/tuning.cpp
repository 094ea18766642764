// The table of tuning overrides (tuning.hpp says what they are for). Keep docs/tuning.md in step:
// tests/api/tuning_test.cpp checks that every row is documented there.
#include "cuda/tuning.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

#include "deca/error.hpp"

namespace deca::cuda {

namespace {

constexpr TuningRow kRows[] = {
    // ---- GQA ----
    {Tuning::kGqaSplits, "DECA_GQA_SPLITS", 1, 4096, nullptr, "the split model's count",
     "splits per (request, kv head) unit, clamped to what the merge and the keys allow"},
    {Tuning::kGqaSm9016Bit, "DECA_GQA_SM90_16BIT", 0, 1, nullptr,
     "bf16 / fp16 caches at head_dim 64, 128 or 256 without beams take the Hopper wgmma kernel on sm_90a "
     "(\"_wgmma\" in kernel_name; with skip-softmax \"_wgmma_st3_skip\" up to 16 rows, \"_wgmma_rm_skip\" at 32 / 64)",
     "0: those caches take the portable mma.sync kernel on sm_90a too (the GPU tests run both; A/B "
     "measurement)"},
    // ---- MLA ----
    {Tuning::kMlaKernel, "DECA_MLA_KERNEL", 0, 0, "portable", "the sm90a kernels on sm_90",
     "portable: run the sm_80 mma.sync MLA kernels on Hopper too"},
};

// Variables that chose variants since deleted: name, and what to do instead.
struct Retired {
  const char* env;
  const char* instead;
};
constexpr Retired kRetired[] = {
    // ---- GQA ---- (docs/perf-notes.md, "Retired variants", has their measurements)
    {"DECA_GQA_SM90_BALANCED",
     "the Hopper kernel runs one CTA per (request, kv head, row block, split); DECA_GQA_SPLITS sets the splits"},
    {"DECA_GQA_SM90_WG", "the Hopper kernel runs one warpgroup per CTA"},
    {"DECA_GQA_SM90_OVERLAP", "the Hopper kernel issues a tile's QK after the previous tile's PV"},
    {"DECA_GQA_SM90_ROWS_M", "32 and 64 query rows per KV head always take the rows-on-M Hopper kernel"},
    {"DECA_GQA_SM90_STAGES",
     "the plan sizes the Hopper kernel's ring from its grid (2 stages where it fills 3 CTAs per SM)"},
    {"DECA_GQA_FP8_MMA",
     "the plan picks the 8-bit path per arch: fp8 wgmma on sm_90 (head_dim 128, no beams), two_term on "
     "sm_89, widen_ldsm elsewhere; int8 two_term_qk on sm_90, widen_ldsm elsewhere"},
    {"DECA_GQA_CTAS", "the GQA kernels are built for 2 CTAs per SM"},
    {"DECA_GQA_FIXEDCOST_VARIANT",
     "the shared-memory split merge lost to the streaming merge, see docs/perf-notes.md"},
    // ---- MLA ----
    // The sm90 decode kernels' knobs: one kernel per head-count class now (traits.cuh kernel_class;
    // docs/perf-notes-mla.md, "Retired variants", has what each chose and measured).
    {"DECA_MLA_CLUSTER", "65..128 heads run in clusters of 2, fewer without one"},
    {"DECA_MLA_PIPE", "the producers gather a block's whole share in one round"},
    {"DECA_MLA_DEQUANT", "the producers convert with the hardware e4m3 conversions"},
    {"DECA_MLA_SYNC", "a cluster's hand-overs are the light ones"},
    {"DECA_MLA_PREFETCH", "the producers prefetch each record's lines into L2"},
    {"DECA_MLA_AHEAD", "the L2 prefetch runs one block ahead"},
    {"DECA_MLA_MAP", "the producers store whole 128-byte rows"},
    {"DECA_MLA_L1", "the gather's L1 policy follows the cluster (evict_last without one)"},
    {"DECA_MLA_RESCALE", "the consumers keep lazy maxima"},
    {"DECA_MLA_PHAND", "P goes to consumer 1's registers in a cluster, after consumer 0's P V without one"},
    {"DECA_MLA_PRODUCERS", "the wide kernel has two producer warpgroups"},
    {"DECA_MLA_PEERCOPY", "the peer's rows cross by st.async"},
    {"DECA_MLA_SEESAW", "consumer 0 runs every block's QK^T and softmax"},
    {"DECA_MLA_STAGE", "at most 16 heads run the direct kernel"},
    {"DECA_MLA_NARROW", "at most 16 heads run the direct kernel"},
    {"DECA_MLA_DIRECT", "at most 16 heads run the direct kernel (its alternating consumers)"},
    {"DECA_MLA_STAMP", "time phases with the ablations of tests/gpu/mla_sm90_timing_test.cpp"},
    {"DECA_MLA_DENSE_CONSUMERS", "dense plans run the default consumers (the split ones were slower on every row)"},
    {"DECA_MLA_SM90_CHECKED", "checked plans on sm_90 run the sm90a kernels' checked builds"},
    {"DECA_MLA_COMBINE",
     "the plan takes the split combine when its longest requests are each cut into 16 or more pieces"},
};

std::string quoted(const char* s) { return std::string("\"") + s + "\""; }

}  // namespace

const TuningRow* tuning_rows(int* count) {
  *count = static_cast<int>(sizeof(kRows) / sizeof(kRows[0]));
  return kRows;
}

void refuse_retired_tuning(const char* fn) {
  for (const Retired& r : kRetired) {
    if (r.env == nullptr) continue;
    if (const char* v = std::getenv(r.env); v != nullptr && *v != '\0') {
      throw Error(std::string(fn) + ": environment " + r.env + ": expected unset (the variants it chose " +
                  "were retired: " + r.instead + "), got " + quoted(v));
    }
  }
}

std::optional<int> tuning_override(Tuning id, const char* fn) {
  for (const TuningRow& row : kRows) {
    if (row.id != id) continue;
    const char* v = std::getenv(row.env);
    if (v == nullptr || *v == '\0') return std::nullopt;
    if (row.values != nullptr) {
      int index = 0;
      const char* word = row.values;
      while (*word != '\0') {
        const char* end = std::strchr(word, '|');
        const std::size_t n = end ? static_cast<std::size_t>(end - word) : std::strlen(word);
        if (std::strlen(v) == n && std::strncmp(v, word, n) == 0) return index;
        if (end == nullptr) break;
        word = end + 1;
        ++index;
      }
      throw Error(std::string(fn) + ": environment " + row.env + ": expected one of " +
                  quoted(row.values) + " (" + row.what + "), got " + quoted(v));
    }
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || x < row.lo || x > row.hi) {
      throw Error(std::string(fn) + ": environment " + row.env + ": expected an integer in [" +
                  std::to_string(row.lo) + ", " + std::to_string(row.hi) + "] (" + row.what + "), got " +
                  quoted(v));
    }
    return static_cast<int>(x);
  }
  return std::nullopt;
}

}  // namespace deca::cuda
