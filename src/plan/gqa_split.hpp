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
  // How fast one CTA streams its keys alone, in SM shares of the DRAM rate (the device's rate /
  // sm_count): below 1, one CTA per SM leaves DRAM bandwidth unused and a second resident CTA
  // pays; at 1 or more, one CTA per SM already takes its share (cta_rate() fills it).
  double cta_rate = 1.0;
};

// Splits per unit minimising a model of the launch, in units of one tile streamed at an SM's
// share of the DRAM rate. Where the unsplit grid fits one wave of resident CTAs, an SM runs
// ceil(CTAs / SMs) CTAs and streams their tiles at min(resident CTAs x cta_rate, 1) shares, a
// few percent less when CTAs share it (they contend for its issue slots and memory pipes). Where
// it overflows a wave, each wave streams its CTAs' tiles (shorter CTAs even out the last wave).
// Each wave adds a fixed cost (prologue, first bytes, epilogue) and a split launch its merge,
// which grows with the split count. Ties go to fewer splits (less workspace traffic). Measured
// on H100 (docs/perf-notes.md, the split sweep).
int choose_num_splits(const SplitInputs& in);

// One CTA's streaming rate in SM shares: the kernel's own rate (cta_bytes_per_us) against the
// device's DRAM rate (peak_dram_bytes_per_us, of which copies reach ~90 %) split over sm_count.
// 1 (neutral) when the device does not report its DRAM rate.
double cta_rate(double cta_bytes_per_us, double peak_dram_bytes_per_us, int sm_count);

// What one CTA of the Hopper GQA kernel streams alone, by the cache's bytes per element (bf16 /
// fp16: 2, fp8 / int8: 1), in bytes per microsecond: measured on H100 with half the SMs holding
// one CTA each (docs/perf-notes.md: the 8-bit figure is the dequantisation's issue bound, the
// 16-bit one near the DRAM's rate, so a lower bound). Other kernels (the portable one, other
// head dims, rows on M) and other GPUs are taken at their cache width's figure, unmeasured.
double gqa_cta_bytes_per_us(int kv_bytes);

// The fixed-split mode's keys per split: the request rounded up to whole tiles (at least one).
int fixed_split_tokens(int requested, int tile);

// Splits needed to cover `max_keys` with `split_tokens` keys each (at least 1).
int fixed_num_splits(int max_keys, int split_tokens);

}  // namespace deca::plan
