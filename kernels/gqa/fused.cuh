// The fused decode step in the GQA kernels (Cfg::kRopeStyle != 0; docs/design.md, "Fused decode
// step"): what both kernels compute the same way. q rows and this step's keys are rotated and
// rounded to q's dtype (kernels/gqa/rope.cuh, the reference's arithmetic), and the new keys and
// values coded as the cache stores them. The kernels use the codes from shared memory in place
// of the slots' bytes (the CTAs that read a new token each compute it) and one CTA per slot
// writes them to the cache.
#pragma once

#include "kernels/common/check_record.cuh"
#include "kernels/common/kv_kind.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/gqa/params.cuh"
#include "kernels/gqa/request.cuh"
#include "kernels/gqa/rope.cuh"

namespace deca::gqa::fused {

// A q-dtype element as a float, and a float rounded to q's dtype (bits).
template <class T>
__device__ __forceinline__ float load_q_elem(const void* base, long long off) {
  const unsigned short b = static_cast<const unsigned short*>(base)[off];
  return T::kQDtype == kv::kFP16 ? ptx::fp16_bits_to_float(b) : ptx::bf16_bits_to_float(b);
}
template <class T>
__device__ __forceinline__ unsigned short q_bits(float x) {
  return T::kQDtype == kv::kFP16 ? ptx::float_to_fp16_bits(x) : ptx::float_to_bf16_bits(x);
}
template <class T>
__device__ __forceinline__ float round_q(float x) {
  const unsigned short b = q_bits<T>(x);
  return T::kQDtype == kv::kFP16 ? ptx::fp16_bits_to_float(b) : ptx::bf16_bits_to_float(b);
}

__device__ __forceinline__ float load_cos_sin(const GqaParams& p, long long off) {
  if (p.cos_sin_dtype == kv::kFP32) return static_cast<const float*>(p.cos_sin)[off];
  const unsigned short b = static_cast<const unsigned short*>(p.cos_sin)[off];
  return p.cos_sin_dtype == kv::kFP16 ? ptx::fp16_bits_to_float(b) : ptx::bf16_bits_to_float(b);
}

// The rotary position of new token i of batch entry b (length len > 0). Checked mode: a position
// outside cos_sin_cache's rows is recorded (position 1: from `positions`, 0: derived from
// seq_lens) and read as 0, so that no row past the cache is dereferenced.
template <class T>
__device__ __forceinline__ int token_pos(const GqaParams& p, int b, int i, int len) {
  const int pos = p.positions ? p.positions[b * p.positions_stride_batch + i] : len - p.q_len + i;
  if constexpr (T::kChecked) {
    if (static_cast<unsigned>(pos) >= static_cast<unsigned>(p.max_position)) {
      check_report(static_cast<CheckRecord*>(p.check), kCheckPosition, b, i, p.positions ? 1 : 0, pos,
                   p.max_position);
      return 0;
    }
  }
  return pos;
}

// Pair j (0 .. head_dim / 2) of a row: the rotary pairs first (frequency j), then the unrotated
// dims two by two.
struct PairDims {
  int a;
  int b;
  bool rotated;
};
template <class T>
__device__ __forceinline__ PairDims pair_dims(int j) {
  constexpr int kHalf = T::kRotaryDim / 2;
  if (j < kHalf) return PairDims{rope_first(T::kRopeStyle, j), rope_second(T::kRopeStyle, kHalf, j), true};
  const int a = T::kRotaryDim + 2 * (j - kHalf);
  return PairDims{a, a + 1, false};
}

// Pair j of the q-dtype row at `row` (element offsets), rotated at `pos` when it is a rotary pair
// and rounded to q's dtype: the values a separate rotary step would have stored.
template <class T>
__device__ __forceinline__ float2 rotated_pair(const GqaParams& p, const void* base, long long row, int pos,
                                               const PairDims& d, int j) {
  const float x = load_q_elem<T>(base, row + d.a);
  const float y = load_q_elem<T>(base, row + d.b);
  if (!d.rotated) return make_float2(x, y);
  const long long cs = static_cast<long long>(pos) * p.cos_sin_stride;
  const float c = load_cos_sin(p, cs + j);
  const float s = load_cos_sin(p, cs + T::kRotaryDim / 2 + j);
  return make_float2(round_q<T>(rope_x(x, y, c, s)), round_q<T>(rope_y(x, y, c, s)));
}

// The cache's code of a q-dtype value: 16-bit converted, 8-bit round(value / scale).
template <class T>
__device__ __forceinline__ unsigned cache_code(float v, float scale) {
  if constexpr (T::kKvDtype == kv::kFP8) {
    return ptx::float_to_fp8_bits(__fdiv_rn(v, scale));
  } else if constexpr (T::kKvDtype == kv::kINT8) {
    return static_cast<unsigned char>(int8_code(__fdiv_rn(v, scale)));
  } else if constexpr (T::kKvDtype == kv::kFP16) {
    return ptx::float_to_fp16_bits(v);
  } else {
    return ptx::float_to_bf16_bits(v);
  }
}

template <class T>
__device__ __forceinline__ void store_code(unsigned char* row, int d, unsigned code) {
  if constexpr (kv::kind_of(T::kKvDtype) == kv::kKv16) {
    reinterpret_cast<unsigned short*>(row)[d] = static_cast<unsigned short>(code);
  } else {
    row[d] = static_cast<unsigned char>(code);
  }
}

// New token i of batch entry b (length len), kv head h, pair j: the cache's codes of its key pair
// j (rotated) and value pair j (dims 2j, 2j + 1, not rotated), and their dims. With `write`, they
// are also stored into the token's cache slot; checked mode skips a page id out of range (the
// loader has recorded it and masks the tile).
struct NewPair {
  PairDims kd;
  unsigned k0, k1, v0, v1;
};
template <class T>
__device__ __forceinline__ NewPair code_new_pair(const GqaParams& p, int b, int i, int len, int h, int j, bool write) {
  constexpr int kBytes = kv::kind_of(T::kKvDtype) == kv::kKv16 ? 2 : 1;
  const int t = len - p.q_len + i;
  const int pos = token_pos<T>(p, b, i, len);
  const float ks = p.k_scales ? p.k_scales[h] : p.k_scale;
  const float vs = p.v_scales ? p.v_scales[h] : p.v_scale;
  NewPair r;
  r.kd = pair_dims<T>(j);
  const float2 k = rotated_pair<T>(p, p.k_new, b * p.k_new_stride_batch + i * p.k_new_stride_token + h * p.k_new_stride_head,
                                   pos, r.kd, j);
  const float2 v = rotated_pair<T>(p, p.v_new, b * p.v_new_stride_batch + i * p.v_new_stride_token + h * p.v_new_stride_head,
                                   pos, PairDims{2 * j, 2 * j + 1, false}, j);
  r.k0 = cache_code<T>(k.x, ks);
  r.k1 = cache_code<T>(k.y, ks);
  r.v0 = cache_code<T>(v.x, vs);
  r.v1 = cache_code<T>(v.y, vs);
  if (write) {
    const int page = p.page_table[b * p.page_table_stride + t / T::kPageSize];
    bool ok = true;
    if constexpr (T::kChecked) ok = static_cast<unsigned>(page) < static_cast<unsigned>(p.num_pages);
    if (ok) {
      const long long slot = t % T::kPageSize;
      unsigned char* kc = const_cast<unsigned char*>(static_cast<const unsigned char*>(p.k_cache)) +
                          (page * p.k_stride_page + slot * p.k_stride_slot + h * p.k_stride_head) * kBytes;
      unsigned char* vc = const_cast<unsigned char*>(static_cast<const unsigned char*>(p.v_cache)) +
                          (page * p.v_stride_page + slot * p.v_stride_slot + h * p.v_stride_head) * kBytes;
      store_code<T>(kc, r.kd.a, r.k0);
      store_code<T>(kc, r.kd.b, r.k1);
      store_code<T>(vc, 2 * j, r.v0);
      store_code<T>(vc, 2 * j + 1, r.v1);
    }
  }
  return r;
}

// A CTA's new-token items: the keys [lo, hi) = [max(lo_key, first new), min(hi_key, len)) of
// its range, head_dim / 2 pairs each; item k is token lo + k / (head_dim / 2), pair
// k % (head_dim / 2), and thread `tid` of `threads` takes items tid, tid + threads, ...
// Its first item is coded when the kernel starts (early_pair: its loads overlap the pipeline's
// first tiles, and row block 0 writes it to the cache then), so that the tile holding it only
// stores the codes; t < 0: the thread has no such item (or the kernel codes none early).
struct EarlyPair {
  int t;
  int j;
  NewPair c;
};
__device__ __forceinline__ EarlyPair no_early_pair() {
  EarlyPair e;
  e.t = -1;
  return e;
}

template <class T>
__device__ __forceinline__ EarlyPair early_pair(const GqaParams& p, int b, int len, int h, int lo_key, int hi_key,
                                                int tid, bool write) {
  constexpr int kPairs = T::kHeadDim / 2;
  const int first_new = len - p.q_len;
  const int lo = lo_key > first_new ? lo_key : first_new;
  const int hi = hi_key < len ? hi_key : len;
  if (len == 0 || tid >= (hi - lo) * kPairs) return no_early_pair();
  EarlyPair e;
  e.t = lo + tid / kPairs;
  e.j = tid % kPairs;
  e.c = code_new_pair<T>(p, b, e.t - first_new, len, h, e.j, write);
  return e;
}

// early_pair in a fused kernel without beams (their items are coded at their tiles), else none.
template <class T>
__device__ __forceinline__ EarlyPair kernel_early_pair(const GqaParams& p, int b, int len, int h, int lo_key,
                                                       int hi_key, int tid, bool write) {
  if constexpr (T::kFused && T::kBeamWidth == 1) {
    return early_pair<T>(p, b, len, h, lo_key, hi_key, tid, write);
  } else {
    return no_early_pair();
  }
}

// The items of the tile [t0, t0 + tile) (the same numbering as early_pair's): each coded (the
// thread's early one taken as it is) and handed to store(row in the tile, pair, codes); with
// `write`, the ones not coded early also go to the cache.
template <class T, class Store>
__device__ __forceinline__ void append_tile(const GqaParams& p, int b, int len, int h, int lo_key, int hi_key,
                                            int t0, int tile, int tid, int threads, const EarlyPair& early,
                                            bool write, const Store& store) {
  constexpr int kPairs = T::kHeadDim / 2;
  if (len == 0) return;
  const int first_new = len - p.q_len;
  const int lo = lo_key > first_new ? lo_key : first_new;
  const int hi = hi_key < len ? hi_key : len;
  const int k_lo = ((t0 > lo ? t0 : lo) - lo) * kPairs;
  const int k_hi = ((t0 + tile < hi ? t0 + tile : hi) - lo) * kPairs;
  int k = tid;
  if (k < k_lo) k += (k_lo - k + threads - 1) / threads * threads;
  for (; k < k_hi; k += threads) {
    const int t = lo + k / kPairs;
    const int j = k % kPairs;
    const NewPair c = k == tid && early.t >= 0 ? early.c : code_new_pair<T>(p, b, t - first_new, len, h, j, write);
    store(t - t0, j, c);
  }
}

// q element d of a row (q-dtype row at `row`) at `pos`, rotated and rounded: for kernels that load
// q element by element.
template <class T>
__device__ __forceinline__ float rotated_q_elem(const GqaParams& p, long long row, int pos, int d) {
  constexpr int kHalf = T::kRotaryDim / 2;
  if (d >= T::kRotaryDim) return load_q_elem<T>(p.q, row + d);
  const int j = T::kRopeStyle == 1 ? d % kHalf : d / 2;
  const PairDims pd{rope_first(T::kRopeStyle, j), rope_second(T::kRopeStyle, kHalf, j), true};
  const float2 r = rotated_pair<T>(p, p.q, row, pos, pd, j);
  return d == pd.a ? r.x : r.y;
}

}  // namespace deca::gqa::fused
