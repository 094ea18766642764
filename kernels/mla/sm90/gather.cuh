// The producers' loads of cache records (the 656-byte token's pieces, dense rows), shared by the
// records' producer (producer.cuh) and the dense rows' (rows.cuh).
#pragma once

#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/sm90/config.cuh"

namespace deca::mla::sm90 {

using namespace ::deca::sm90;  // the Hopper PTX wrappers

// A 16-byte / 8-byte load of a cache record with the gather's L1 policy (config.cuh).
// The no-gather ablation returns bytes made from the address instead (from addr_bits): e4m3 and
// bf16 in [0.5, 1), all finite, and dependent on the id as a load's result would be.
__device__ __forceinline__ unsigned addr_bits(const unsigned char* p) {  // the low 32 bits
  return static_cast<unsigned>(reinterpret_cast<unsigned long long>(p));
}
template <class Cfg>
__device__ __forceinline__ uint4 load_rec16(const unsigned char* p) {
  if constexpr (kNoGather<Cfg>) {
    const unsigned v = (addr_bits(p) & 0x07070707u) | 0x30303030u;
    return make_uint4(v, v ^ 0x01010101u, v ^ 0x02020202u, v ^ 0x04040404u);
  }
  if constexpr (kL1EvictLast<Cfg>) return ldg_nc_el_v4(p);
  return ldg_nc_na_v4(p);
}
template <class Cfg>
__device__ __forceinline__ uint2 load_rec8(const unsigned char* p) {
  if constexpr (kNoGather<Cfg>) {
    const uint4 v = load_rec16<Cfg>(p);
    return make_uint2(v.x, v.y);
  }
  if constexpr (kL1EvictLast<Cfg>) return ldg_nc_el_v2(p);
  return ldg_nc_na_v2(p);
}

// The same for a dense row's units (rows.cuh): each CTA reads a row once, whole, in contiguous
// pieces, so nothing is kept in L1.
template <class Cfg>
__device__ __forceinline__ uint4 load_row16(const unsigned char* p) {
  if constexpr (kNoGather<Cfg>) return load_rec16<Cfg>(p);
  return ldg_nc_na_v4(p);
}
template <class Cfg>
__device__ __forceinline__ uint2 load_row8(const unsigned char* p) {
  if constexpr (kNoGather<Cfg>) return load_rec8<Cfg>(p);
  return ldg_nc_na_v2(p);
}

}  // namespace deca::mla::sm90
