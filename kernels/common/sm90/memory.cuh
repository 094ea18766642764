// Memory instructions of the Hopper kernels, one wrapper per instruction with its PTX syntax:
// non-coherent global loads with L1 / L2 cache hints (the gathers' records), L2 prefetches, and
// shared-memory stores (st.shared, stmatrix).
#pragma once

#include <cuda/ptx>
#include <cuda/std/cstdint>

namespace deca::sm90 {

// ---- Global loads (PTX ISA 9.7.9.8, ld with cache hints) -----------------------------------------
// ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {a, b, c, d}, [addr];
// Read-only gathered cache rows: nothing is reused through L1 (each CTA reads a token once), and
// the 256 B L2 prefetch brings the neighbouring sectors of the same 656-byte record.
__device__ __forceinline__ uint4 ldg_nc_na_v4(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
// ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {a, b}, [addr]; (8-byte pieces of the same rows)
__device__ __forceinline__ uint2 ldg_nc_na_v2(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
// ld.global.nc.L1::no_allocate.f32 d, [addr];
__device__ __forceinline__ float ldg_nc_na_f32(const void* p) {
  float v;
  asm volatile("ld.global.nc.L1::no_allocate.f32 %0, [%1];\n" : "=f"(v) : "l"(p));
  return v;
}
// ld.global.nc.L1::evict_last.L2::256B.v4.u32 / .f32: the same loads allocating in L1 with the
// evict-last policy (what FlashMLA's gather uses).
__device__ __forceinline__ uint4 ldg_nc_el_v4(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::evict_last.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ldg_nc_el_v2(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::evict_last.L2::256B.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ float ldg_nc_el_f32(const void* p) {
  float v;
  asm volatile("ld.global.nc.L1::evict_last.f32 %0, [%1];\n" : "=f"(v) : "l"(p));
  return v;
}
// Three 8-byte loads of one gathered record, [p], [p + 128] and [s], taken only for a valid id
// (`id` >= 0; zeros otherwise, no memory touched) with one test inside the asm: the addresses
// are then computed for every id, unpredicated (under the id's branch ptxas reloaded the strides
// per record), and p + 128 stays an immediate. kEvictLast: L1::evict_last, else no_allocate.
#define DECA_LDG_NC_V2X3_IF(L1)                                                                         \
  "{\n .reg .pred q;\n setp.ge.s32 q, %6, 0;\n"                                                      \
  " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n mov.b32 %4, 0;\n mov.b32 %5, 0;\n" \
  " @q ld.global.nc." L1 ".L2::256B.v2.u32 {%0, %1}, [%7];\n"                                         \
  " @q ld.global.nc." L1 ".L2::256B.v2.u32 {%2, %3}, [%7+128];\n"                                     \
  " @q ld.global.nc." L1 ".L2::256B.v2.u32 {%4, %5}, [%8];\n}\n"
template <bool kEvictLast>
__device__ __forceinline__ void ldg_nc_v2x3_if(int id, const void* p, const void* s, uint2& a, uint2& b,
                                               uint2& c) {
  if constexpr (kEvictLast) {
    asm volatile(DECA_LDG_NC_V2X3_IF("L1::evict_last")
                 : "=r"(a.x), "=r"(a.y), "=r"(b.x), "=r"(b.y), "=r"(c.x), "=r"(c.y)
                 : "r"(id), "l"(p), "l"(s));
  } else {
    asm volatile(DECA_LDG_NC_V2X3_IF("L1::no_allocate")
                 : "=r"(a.x), "=r"(a.y), "=r"(b.x), "=r"(b.y), "=r"(c.x), "=r"(c.y)
                 : "r"(id), "l"(p), "l"(s));
  }
}
#undef DECA_LDG_NC_V2X3_IF
// ld.global.nc.s32 d, [addr]; (indices: several threads read the same word, L1 may keep it)
__device__ __forceinline__ int ldg_nc_s32(const int* p) {
  int v;
  asm volatile("ld.global.nc.s32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}

// prefetch.global.L2 [addr]; -- starts the HBM read of a line a block ahead of its ld; no
// register is tied up while it is in flight.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}
// cp.async.bulk.prefetch.L2.global [addr], bytes; -- the whole range (16-byte aligned, a
// multiple of 16 bytes) into L2 by the copy engine, one instruction and no register for a
// record that spans several lines (prefetch.global.L2 pulls one line per instruction).
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, unsigned bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}

// ---- Shared-memory stores (PTX ISA 9.7.9.9, st) --------------------------------------------------
__device__ __forceinline__ void sts128(unsigned addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}
// stmatrix.sync.aligned.m8n8.x4.shared.b16 [addr], {r0, r1, r2, r3}; (sm_90) -- four 8 x 8 b16
// matrices; lanes 8 m .. 8 m + 7 give the row addresses of matrix m, and lane T's register m is
// row T / 4, columns 2 (T % 4) and + 1 of matrix m.
__device__ __forceinline__ void stmatrix_x4(unsigned addr, const unsigned (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
// The same, each matrix stored transposed (.trans): lane T's register m is column T / 4, rows
// 2 (T % 4) and + 1 of the stored matrix m.
__device__ __forceinline__ void stmatrix_x4_trans(unsigned addr, const unsigned (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
__device__ __forceinline__ void sts32(unsigned addr, unsigned v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void sts16(unsigned addr, unsigned short v) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(v) : "memory");
}

}  // namespace deca::sm90
