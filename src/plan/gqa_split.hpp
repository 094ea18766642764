// Split-KV policy for GQA decode: pure functions of shapes and device limits, tested by tables
// (tests/plan/). Graph-stable by construction: they see the maxima a caller promises, never live
// lengths.
#pragma once

namespace deca::plan {

// What an SM offers a CTA (H100/H200 values by default; the backend fills them from the device).
struct SmLimits {
  int regs_per_sm = 65536;
  int smem_per_sm = 233472;           // bytes, the 1 KB per-CTA reservation included
  int smem_reserved_per_cta = 1024;
  int max_threads_per_sm = 2048;
  int max_ctas_per_sm = 32;
  int reg_alloc_unit = 256;           // registers are granted per warp in units of this many
};

// How many CTAs of a kernel are resident on one SM at once (at least 1 when it fits at all).
int ctas_per_sm(int regs_per_thread, int threads_per_cta, int smem_per_cta, const SmLimits& sm);

struct SplitInputs {
  long long units;  // CTAs without splitting: batch * kv_heads * row_blocks (at the promised max)
  int max_keys;     // most keys one request can see (window-limited where a window is set)
  int tile;         // keys per pipeline stage of the kernel
  int sm_count;
  int ctas_per_sm;
  int max_splits;   // hard cap (workspace)
};

// Splits per unit minimising a simple model of the launch: waves x (tiles per split + a fixed
// per-CTA cost of about two tiles for the prologue, Q load and epilogue) + a merge cost that
// grows with the split count. Ties go to fewer splits (less workspace traffic).
int choose_num_splits(const SplitInputs& in);

// The fixed-split mode's keys per split: the request rounded up to whole tiles (at least one).
int fixed_split_tokens(int requested, int tile);

// Splits needed to cover `max_keys` with `split_tokens` keys each (at least 1).
int fixed_num_splits(int max_keys, int split_tokens);

}  // namespace deca::plan
