// Thin wrappers over the PTX instructions the kernels use, one per instruction, each naming the
// PTX ISA section and the architecture it needs. Only what CCCL's cuda::ptx does not offer
// (mma.sync, ldmatrix, cp.async with zero fill, ex2.approx, prmt, cvt packs) lives here.
#pragma once

namespace deca::ptx {

// ---- Shared-memory addressing -------------------------------------------------------------
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ---- cp.async (PTX ISA 9.7.9.25, sm_80+) ----------------------------------------------------
// 16-byte copy global -> shared, bypassing L1 (.cg). When `valid` is false, src_size 0 makes the
// hardware write 16 zero bytes and read nothing: out-of-range tokens become zeros, never NaN.
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_size)
               : "memory");
}
// 8-byte copy global -> shared through L1 (.ca: cp.async's only path below 16 bytes), zero
// filled and reading nothing when `valid` is false, as cp_async_16.
__device__ __forceinline__ void cp_async_8(unsigned dst, const void* src, bool valid) {
  const int src_size = valid ? 8 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(src_size) : "memory");
}
// cp.async.mbarrier.arrive.noinc.shared::cta.b64 [mbar]; -- an arrival on the mbarrier once every
// cp.async this thread issued before has completed (.noinc: the barrier's count includes it).
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(unsigned mbar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(mbar) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ---- ldmatrix (PTX ISA 9.7.14.5.15, sm_75+) -------------------------------------------------
__device__ __forceinline__ void ldmatrix_x4(unsigned addr, unsigned& r0, unsigned& r1,
                                            unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned addr, unsigned& r0, unsigned& r1,
                                                  unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(unsigned addr, unsigned& r0, unsigned& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2_trans(unsigned addr, unsigned& r0, unsigned& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(addr));
}

__device__ __forceinline__ unsigned lds32(unsigned addr) {
  unsigned v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint2 lds64(unsigned addr) {
  uint2 v;
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint4 lds128(unsigned addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ unsigned lds16(unsigned addr) {
  unsigned short v;
  asm volatile("ld.shared.b16 %0, [%1];\n" : "=h"(v) : "r"(addr));
  return v;
}

// ---- mma.sync m16n8k16, fp32 accumulate (PTX ISA 9.7.14.5.8, sm_80+) -------------------------
// A: 4 regs (row-major 16x16), B: 2 regs (col-major 16x8), C/D: 4 floats.
template <bool kFp16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                          unsigned b1) {
  if constexpr (kFp16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// ---- mma.sync m16n8k32 e4m3 x e4m3, fp32 accumulate (PTX ISA 9.7.14.5.8, sm_89+) ------------
// A: 4 regs of 4 bytes (row-major 16x32: a0 row g, k 4c..4c+3; a1 row g+8; a2/a3 the same at
// k + 16), B: 2 regs (col-major 32x8: b0 column g, k 4c..4c+3; b1 k + 16), C/D as m16n8k16.
__device__ __forceinline__ void mma_e4m3_16832(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                               unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- mma.sync m16n8k32 s8 x s8, int32 accumulate (PTX ISA 9.7.14.5.8, sm_80+) ---------------
// Fragments as mma_e4m3_16832 (8-bit A and B); native IMMA.16832 on sm_80 to sm_90, where the
// e4m3 form above is emulated on sm_90. d = a . b + c:
__device__ __forceinline__ void mma_s8_16832(int (&d)[4], const unsigned (&a)[4], unsigned b0,
                                             unsigned b1, int c0, int c1, int c2, int c3) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c0), "r"(c1),
        "r"(c2), "r"(c3));
}
// d += a . b.
__device__ __forceinline__ void mma_s8_16832(int (&d)[4], const unsigned (&a)[4], unsigned b0,
                                             unsigned b1) {
  mma_s8_16832(d, a, b0, b1, d[0], d[1], d[2], d[3]);
}

// ---- Arithmetic helpers -----------------------------------------------------------------------
// 2^x with the SFU (PTX ISA 9.7.4.x ex2.approx, relative error ~2^-22); ex2(-inf) = +0.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float lg2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// prmt.b32 (PTX ISA 9.7.8.7): picks four bytes out of {b, a} (a = bytes 0..3, b = bytes 4..7).
__device__ __forceinline__ unsigned prmt(unsigned a, unsigned b, unsigned selector) {
  unsigned d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
  return d;
}

// Packs two floats to bf16x2 / f16x2, round to nearest even; `lo` lands in the low half.
template <bool kFp16>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  unsigned d;
  if constexpr (kFp16) {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  }
  return d;
}

__device__ __forceinline__ float bf16_bits_to_float(unsigned short b) {
  return __uint_as_float(static_cast<unsigned>(b) << 16);
}
__device__ __forceinline__ float fp16_bits_to_float(unsigned short b) {
  float f;
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(b));
  return f;
}
__device__ __forceinline__ unsigned short float_to_bf16_bits(float f) {
  unsigned short b;
  asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(b) : "f"(f));
  return b;
}
__device__ __forceinline__ unsigned short float_to_fp16_bits(float f) {
  unsigned short b;
  asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(b) : "f"(f));
  return b;
}
// float -> e4m3fn, saturating to +-448 (PTX ISA cvt with .satfinite, sm_89+). On older
// architectures a software path keeps the same rounding.
__device__ __forceinline__ unsigned char float_to_fp8_bits(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned short pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(pair) : "f"(0.f), "f"(f));
  return static_cast<unsigned char>(pair & 0xFF);
#else
  // Round to nearest even in the e4m3 grid by hand: scale so that the kept mantissa bits land in
  // the integer part of a float, round with rintf, and rebuild the code.
  unsigned sign = __float_as_uint(f) >> 31;
  float a = fabsf(f);
  if (a != a) return 0x7F;
  if (a >= 448.f) return static_cast<unsigned char>((sign << 7) | 0x7E);
  int e;
  frexpf(a, &e);            // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1;          // a = 1.x * 2^exp
  if (exp < -6) exp = -6;   // subnormal range shares the 2^-6 exponent
  float q = rintf(a * exp2f(static_cast<float>(3 - exp)));  // 3 mantissa bits
  float v = q * exp2f(static_cast<float>(exp - 3));
  if (v >= 448.f) return static_cast<unsigned char>((sign << 7) | 0x7E);
  if (v == 0.f) return static_cast<unsigned char>(sign << 7);
  frexpf(v, &e);
  exp = e - 1;
  unsigned code;
  if (exp < -6) {
    code = static_cast<unsigned>(v * 512.f);  // subnormal: v = m * 2^-9
  } else {
    unsigned mant = static_cast<unsigned>(v * exp2f(static_cast<float>(3 - exp))) & 7u;
    code = (static_cast<unsigned>(exp + 7) << 3) | mant;
  }
  return static_cast<unsigned char>((sign << 7) | code);
#endif
}

// ---- Programmatic dependent launch (PTX ISA 9.7.13.13, "Parallel Synchronization and Communication
// Instructions: griddepcontrol", sm_90+, PTX 7.8) ------------------------------------------------
// The one pair of wrappers every kernel uses (the Hopper kernels' sm90_ptx.cuh has none of its own).
// griddepcontrol.launch_dependents; -- a grid launched behind this one with programmatic stream
// serialization may start once every CTA of this grid executed it or exited; it says nothing
// about this grid's writes (the dependent's wait does). griddepcontrol.wait; -- blocks until the
// grids this one depends on have completed and their memory is visible. Both are no-ops in a
// grid launched without the attribute, and compile to nothing below sm_90 (where launches never
// overlap).
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// ---- atom.add.acq_rel.gpu (PTX ISA 9.7.13.x atom, .acq_rel with .gpu scope: sm_70+) ---------------
// Returns the old value. As a release it makes every write that precedes it in causality order
// visible to a thread whose acquire reads this or a later value of the counter: with a bar.sync
// before it, that is every write of the CTA's threads (the memory model's "Memory
// synchronization" and "Causality order"); as an acquire it orders the writes it observes before
// what follows it, and a bar.sync after it carries that to the CTA's other threads. One
// MEMBAR.ALL.GPU, the atomic and an L1 invalidate on sm_90 (no MEMBAR.SC).
__device__ __forceinline__ unsigned atom_add_acq_rel_gpu(unsigned* p, unsigned v) {
  unsigned old;
  asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

// ---- Special registers (PTX ISA "Special Registers": %globaltimer, %smid; sm_30+) -------------
// mov.u64 d, %globaltimer; -- a 64-bit global nanosecond timer, one clock for every SM (its
// update step is the device's). volatile with a memory clobber: kept in program order with the
// other asm statements around it (the phase stamps of kernels/gqa/stamps.cuh).
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t) :: "memory");
  return t;
}
// mov.u32 d, %smid; -- the SM the thread runs on (for profiling: a CTA never migrates in practice,
// but the ISA does not promise it).
__device__ __forceinline__ unsigned smid() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(s));
  return s;
}

// ---- prefetch.global.L2 (PTX ISA 9.7.9.15, sm_20+) ---------------------------------------------
// Brings the line holding `p` into L2 without a register result: a later load of it waits for an
// L2 hit rather than a DRAM round trip.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

}  // namespace deca::ptx
