// Skip-softmax in the CPU reference (docs/semantics.md "Skip-softmax"): which tiles of a row's
// keys are dropped. The reference's tile order and size define its result; the GPU kernels
// take other tiles in another order (split-KV, warps), so they are held to the error bound, not
// to these bits.
#pragma once

#include <vector>

#include "cpu/attention_core.hpp"

namespace deca::cpu {

// The reference's tiles: kSkipRefTile keys aligned at key 0 (tile k = keys [64 k, 64 k + 64)),
// taken in ascending order.
inline constexpr int kSkipRefTile = 64;

// L of the rule: the keys a row's causal window spans, min(pos + 1, window) (pos + 1 without a
// window), plus `later_drafts`, the draft keys after the row's own (q_len - 1 - i with a tree
// mask, whose bits may show them; 0 without). Draft keys a tree mask hides still count: L bounds
// the visible keys from above.
int skip_span(int pos, int window, int later_drafts = 0);

// Clears visible[t] (t in [lo, hi)) for every key of a dropped tile: a tile whose largest visible
// logit m_t has m_t < m_run + log(factor / span), m_run being the largest logit of the tiles kept
// before it (-inf before the first: the first tile with a visible key is always kept). `visible`
// must be a full mask (not null); logit[t - lo] as row_logits gives it. Returns the tiles dropped.
int drop_skipped_tiles(const std::vector<double>& logit, int lo, int hi, double factor, int span,
                       unsigned char* visible);

// attend_row with the rule applied first (factor > 0).
void attend_row_skip(const double* q, const GatheredKV& kv, int lo, int hi, unsigned char* visible,
                     const RowMath& math, double factor, int span, double* out, double* lse,
                     std::vector<double>& scratch);

}  // namespace deca::cpu
