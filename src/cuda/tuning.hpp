// The environment overrides that choose or tune a GPU kernel, read in one place. Each is a row of
// the table in tuning.cpp (name, allowed values, default, what it does), which docs/tuning.md
// lists for users; the plan code asks `tuning_override` and never calls getenv itself. An
// override is read when a plan is made (never per run) and is part of the kernel's name, so a
// plan keeps the kernels it named. Overrides that were retired (their variants measured slower
// and were deleted; docs/perf-notes*.md keeps the numbers) are refused with a message naming
// what replaced them, so a stale setting cannot silently change nothing.
#pragma once

#include <optional>
#include <string>

namespace deca::cuda {

enum class Tuning {
  // GQA
  kGqaSplits,      // DECA_GQA_SPLITS: splits per unit instead of the split model's choice
  kGqaSm9016Bit,   // DECA_GQA_SM90_16BIT: 1 = bf16 / fp16 caches on the Hopper wgmma kernel
  // MLA
  kMlaKernel,      // DECA_MLA_KERNEL: "portable" forces the sm_80 kernel on Hopper
};

struct TuningRow {
  Tuning id;
  const char* env;       // the variable's name
  int lo, hi;            // allowed integer values (inclusive); text knobs list theirs in `values`
  const char* values;    // text knobs: "|"-separated allowed words, else nullptr
  const char* fallback;  // what the plan does when the variable is unset
  const char* what;      // one line for docs/tuning.md and for error messages
};

// Every row, in documentation order.
const TuningRow* tuning_rows(int* count);

// The variable's value when it is set: an integer in [lo, hi], or for a text knob the index of
// its word in `values`. Unset: nullopt. Set to anything else, or a retired variable set at all:
// deca::Error naming the variable, what it takes and what it got. `fn` names the caller's entry
// point (plan_gqa_decode, plan_mla_decode) for the message.
std::optional<int> tuning_override(Tuning id, const char* fn);

// Throws deca::Error when a retired variable is set (what it did, what replaced it).
void refuse_retired_tuning(const char* fn);

}  // namespace deca::cuda
