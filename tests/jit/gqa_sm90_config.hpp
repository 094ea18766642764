// The plan config the Hopper GQA kernel tests (gqa_sm90_nvrtc_test.cpp, gqa_sm90_16bit_nvrtc_test.cpp)
// start from: page 64, 8 requests of up to 4096 keys, the given heads, head_dim, q_len and cache
// dtype; everything else GqaConfig's defaults.
#pragma once

#include "deca/gqa.hpp"

namespace deca::cuda::testing {

inline GqaConfig sm90_config(int q_heads, int kv_heads, int head_dim, int q_len, DType kv) {
  GqaConfig c;
  c.num_q_heads = q_heads, c.num_kv_heads = kv_heads, c.head_dim = head_dim;
  c.page_size = 64, c.max_batch = 8, c.max_seq_len = 4096, c.max_q_len = q_len;
  c.kv_dtype = kv;
  return c;
}

}  // namespace deca::cuda::testing
