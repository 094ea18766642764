// The softmax-attention arithmetic shared by every reference op: one query row against a set
// of gathered keys, accumulated in double.
//
// Keys are gathered once per attention problem (a request's keys for one KV head, or one query
// token's top-k list) into float buffers, K transposed to [dk][num_keys] so that the logits of
// one row are a sequence of contiguous axpy passes (vectorisable without reassociating any
// sum), V as [num_keys][dv]. Every gathered value is exactly representable in float (bf16,
// fp16, fp8 and int8 codes, or MLA values dequantized to bf16), and the product of two floats is
// exact in double, so nothing is lost before the double accumulation.
#pragma once

#include <cstdint>
#include <vector>

namespace deca::cpu {

struct GatheredKV {
  int num_keys = 0;
  int dk = 0;
  int dv = 0;
  std::vector<float> kt;  // [dk][num_keys]
  std::vector<float> v;   // [num_keys][dv]

  void resize(int keys, int key_dim, int value_dim) {
    num_keys = keys;
    dk = key_dim;
    dv = value_dim;
    kt.resize(static_cast<std::size_t>(keys) * key_dim);
    v.resize(static_cast<std::size_t>(keys) * value_dim);
  }
  float& k_at(int key, int d) { return kt[static_cast<std::size_t>(d) * num_keys + key]; }
  float& v_at(int key, int d) { return v[static_cast<std::size_t>(key) * dv + d]; }
};

struct RowMath {
  double logit_scale = 1.0;  // multiplies dot(q, k_gathered): softmax scale * K dequant scale
  double softcap = 0.0;      // 0 = off
  double value_scale = 1.0;  // multiplies the gathered V
  bool has_sink = false;
  double sink = 0.0;         // a logit in the (capped) logit units; denominator only
};

// The (scaled, soft-capped) logits of q against the keys t in [lo, hi) (clamped to the gathered
// keys) into logit[t - lo]; entries of keys that are not visible are raw dot products, unused.
// Returns whether any key of the range is visible.
bool row_logits(const double* q, const GatheredKV& kv, int lo, int hi, const unsigned char* visible,
                const RowMath& math, std::vector<double>& logit);

// Attends q (dk doubles) to the keys t in [lo, hi) with visible[t] != 0 (visible may be null:
// all keys of the range are visible). Writes out[0..dv) and *lse. A row without a visible key
// gets zeros and lse = -inf. scratch is reused between calls.
void attend_row(const double* q, const GatheredKV& kv, int lo, int hi,
                const unsigned char* visible, const RowMath& math, double* out, double* lse,
                std::vector<double>& scratch);

}  // namespace deca::cpu
