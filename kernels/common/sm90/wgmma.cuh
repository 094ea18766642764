// wgmma (PTX ISA 9.7.15) for the Hopper kernels: the shared-memory matrix descriptor, the
// warpgroup's fence / commit / wait, and one wrapper per mma_async shape the kernels use (bf16 and
// e4m3, A from shared memory or registers), each stating its PTX syntax. Needs sm_90a.
#pragma once

#include <cuda/ptx>
#include <cuda/std/cstdint>

namespace deca::sm90 {

// ---- wgmma shared-memory matrix descriptor (PTX ISA 9.7.15.5.1.2, "Matrix Descriptor Format") --
//   bits  0-13  start address >> 4 (shared window offset, 16-byte aligned)
//   bits 16-29  leading-dimension byte offset >> 4 (LBO)
//   bits 32-45  stride-dimension byte offset >> 4 (SBO)
//   bits 49-51  matrix base offset (0: every 8-row x 128 B swizzle atom starts 1024-aligned)
//   bits 62-63  swizzle: 0 none, 1 = 128 B, 2 = 64 B, 3 = 32 B
// With the 128 B swizzle an atom is 8 rows of 128 B (1024 B) whose 16-byte units are permuted by
// unit ^ (row % 8); the hardware applies the XOR to the address bits [4:6] ^ [7:9], so a start
// address advanced by 32 B inside an atom (the next k16 step of a K-major operand) stays valid.
//   K-major  (A always; B when tnspB = 0): rows are M or N, 64 bf16 of K per 128 B row;
//            SBO = byte distance between consecutive groups of 8 rows; LBO unused ("assumed 1").
//   MN-major (B with tnspB = 1): rows are K, 64 bf16 of N per 128 B row;
//            LBO = byte distance between consecutive 64-element blocks of N,
//            SBO = byte distance between consecutive groups of 8 rows of K.
__device__ __forceinline__ unsigned long long smem_desc_sw128(unsigned smem_byte_addr, unsigned lbo,
                                                              unsigned sbo) {
  return static_cast<unsigned long long>((smem_byte_addr & 0x3FFFFu) >> 4) |
         (static_cast<unsigned long long>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<unsigned long long>((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

// The descriptor of the operand `bytes` further on: the start address is the low 14 bits of the low
// word, and every shared-memory offset stays below 256 KB, so a 32-bit add of bytes / 16 to the low
// word is exact. Built once per tile and advanced per k step, a descriptor costs one uniform add
// per wgmma; rebuilt from the address each time (mask, shift, or) ptxas emits a chain of ~6
// dependent uniform instructions per operand, which made the MLA kernel's 36-wgmma QK^T
// issue-bound (ncu at b128 h128: 13 uniform instructions between consecutive HGMMAs).
__device__ __forceinline__ unsigned long long desc_advance(unsigned long long desc, unsigned bytes) {
  return desc + (bytes >> 4);
}

// ---- wgmma synchronisation (PTX ISA 9.7.15.6) ----------------------------------------------------
// wgmma.fence.sync.aligned; -- orders this warpgroup's register/shared accesses before the next
// wgmma.mma_async (needed before the first one and whenever accumulators were touched).
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
// wgmma.commit_group.sync.aligned; -- closes the wgmma-group of the preceding mma_async.
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// wgmma.wait_group.sync.aligned N; -- waits until at most N groups are pending.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across a wgmma wait: the asm above
// touches no C++ object, so the accumulators are tied to it through an empty asm.
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// ---- wgmma accumulator operands --------------------------------------------------------------
// The wrappers below bind d[b .. b + N - 1] as "+f" operands %0 .. %N-1 (d comes first in every
// operand list), so one pair of lists serves every shape: the operand bindings and the matching
// register-list text of the instruction.
#define DECA_WGMMA_F8(d, b)                                                                        \
  "+f"(d[(b) + 0]), "+f"(d[(b) + 1]), "+f"(d[(b) + 2]), "+f"(d[(b) + 3]), "+f"(d[(b) + 4]),       \
      "+f"(d[(b) + 5]), "+f"(d[(b) + 6]), "+f"(d[(b) + 7])
#define DECA_WGMMA_F32(d, b) \
  DECA_WGMMA_F8(d, b), DECA_WGMMA_F8(d, (b) + 8), DECA_WGMMA_F8(d, (b) + 16), DECA_WGMMA_F8(d, (b) + 24)
#define DECA_WGMMA_F64(d, b) DECA_WGMMA_F32(d, b), DECA_WGMMA_F32(d, (b) + 32)
#define DECA_WGMMA_F128(d) DECA_WGMMA_F64(d, 0), DECA_WGMMA_F64(d, 64)
#define DECA_WGMMA_D8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define DECA_WGMMA_D16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define DECA_WGMMA_D32 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define DECA_WGMMA_D64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define DECA_WGMMA_D128 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"

// ---- wgmma.mma_async bf16 x bf16 -> f32 (PTX ISA 9.7.15.5.2) -------------------------------------
// imm-scale-a = imm-scale-b = 1 (no negation); imm-trans-a = 0 (A K-major); tnspB as templated.
// wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 d, a-desc, b-desc, scale-d, 1, 1, 0, tnspB;
// A and B from shared memory (descriptors); `accumulate` false overwrites d (scale-d = 0).
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], unsigned long long desc_a,
                                                   unsigned long long desc_b, bool accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " DECA_WGMMA_D32
               ", %32, %33, p, 1, 1, 0, %35;\n}\n"
               : DECA_WGMMA_F32(d, 0)
               : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransB));
}

// The same with N = 16 (eight accumulators) and A either K-major or (kTransA = 1) MN-major.
template <int kTransB, int kTransA = 0>
__device__ __forceinline__ void wgmma_m64n16k16_ss(float* d, unsigned long long desc_a,
                                                   unsigned long long desc_b, bool accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 " DECA_WGMMA_D8
               ", %8, %9, p, 1, 1, %11, %12;\n}\n"
               : DECA_WGMMA_F8(d, 0)
               : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransA), "n"(kTransB));
}

// The same with A from registers (the m64k16 bf16 fragment: a[0] row l / 4 of the warp's 16,
// k 2 (l % 4) + 0, 1; a[1] row + 8; a[2] k + 8; a[3] both) and B K-major: the MLA direct
// kernel's RoPE part of S^T (kernels/mla/sm90/direct.cuh).
__device__ __forceinline__ void wgmma_m64n16k16_rs(float* d, const unsigned (&a)[4], unsigned long long desc_b,
                                                   bool accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 " DECA_WGMMA_D8
               ", {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
               : DECA_WGMMA_F8(d, 0)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

// f16 x f16 with A from registers (the same fragment), B K-major: the MLA direct kernel's S^T
// over the NoPE part, the e4m3 keys widened to f16 in registers (exact) so that the products
// accumulate in full f32 (the e4m3 tensor cores keep ~14 bits of the sum: LSE errors of 1e-2).
__device__ __forceinline__ void wgmma_m64n16k16_f16_rs(float* d, const unsigned (&a)[4], unsigned long long desc_b,
                                                       bool accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 " DECA_WGMMA_D8
               ", {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
               : DECA_WGMMA_F8(d, 0)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

// ---- wgmma.mma_async e4m3 x e4m3 -> f32 (PTX ISA 9.7.15.5.2) -------------------------------------
// wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 d, a-desc, b-desc, scale-d, 1, 1;
// 8-bit operands have no transpose: A and B K-major in shared memory (32 e4m3 = 32 B of K per
// k-step). The smallest N: tokens on M, eight query rows on N (docs/design-gqa-sm90.md).
__device__ __forceinline__ void wgmma_m64n8k32_e4m3_ss(float (&d)[4], unsigned long long desc_a,
                                                       unsigned long long desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

// The same for N = 8, 16, 32 and 64 query rows (the GQA kernel's rows per CTA): d holds N / 2
// floats per thread. One specialization per N because the asm operand list is fixed.
template <int N>
struct WgmmaE4m3;
template <>
struct WgmmaE4m3<8> {
  static __device__ __forceinline__ void mma(float (&d)[4], unsigned long long desc_a,
                                             unsigned long long desc_b, bool accumulate) {
    wgmma_m64n8k32_e4m3_ss(d, desc_a, desc_b, accumulate);
  }
};
template <>
struct WgmmaE4m3<16> {
  static __device__ __forceinline__ void mma(float (&d)[8], unsigned long long desc_a,
                                             unsigned long long desc_b, bool accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 " DECA_WGMMA_D8 ", %8, %9, p, 1, 1;\n}\n"
                 : DECA_WGMMA_F8(d, 0)
                 : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
  }
};
template <>
struct WgmmaE4m3<32> {
  static __device__ __forceinline__ void mma(float (&d)[16], unsigned long long desc_a,
                                             unsigned long long desc_b, bool accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 " DECA_WGMMA_D16 ", %16, %17, p, 1, 1;\n}\n"
                 : DECA_WGMMA_F8(d, 0), DECA_WGMMA_F8(d, 8)
                 : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
  }
};
template <>
struct WgmmaE4m3<64> {
  static __device__ __forceinline__ void mma(float (&d)[32], unsigned long long desc_a,
                                             unsigned long long desc_b, bool accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " DECA_WGMMA_D32 ", %32, %33, p, 1, 1;\n}\n"
                 : DECA_WGMMA_F32(d, 0)
                 : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
  }
};

// The rows-on-M kernel's shape (kernels/gqa/sm90/decode_rows.cuh): 64 query rows on M, 128 tokens
// (QK^T) or 128 d (PV) on N. d holds 64 floats per thread: element e is row 16 w + l / 4 +
// 8 ((e >> 1) & 1), column 8 (e >> 2) + 2 (l % 4) + (e & 1) (w the warp, l the lane).
// wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 d, a-desc, b-desc, scale-d, 1, 1;
__device__ __forceinline__ void wgmma_m64n128k32_e4m3_ss(float (&d)[64], unsigned long long desc_a,
                                                        unsigned long long desc_b, bool accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " DECA_WGMMA_D64 ", %64, %65, p, 1, 1;\n}\n"
               : DECA_WGMMA_F64(d, 0)
               : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

// The same with A from registers: the m64k32 8-bit fragment of warp w (rows 16 w ..): a[0] row
// l / 4, k 4 (l % 4) + 0..3 (byte i = k + i); a[1] row + 8; a[2] k + 16; a[3] both.
// wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 d, {a0, a1, a2, a3}, b-desc, scale-d, 1, 1;
__device__ __forceinline__ void wgmma_m64n128k32_e4m3_rs(float (&d)[64], const unsigned (&a)[4],
                                                        unsigned long long desc_b, bool accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " DECA_WGMMA_D64
               ", {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
               : DECA_WGMMA_F64(d, 0)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

// N = 64 with A from registers (the fragment above), B K-major: the rows-on-M skip kernel's PV in
// two halves of d (kernels/gqa/sm90/skip_rows.cuh); d holds 32 floats, laid out as the first 32
// of m64n128's.
__device__ __forceinline__ void wgmma_m64n64k32_e4m3_rs(float (&d)[32], const unsigned (&a)[4],
                                                       unsigned long long desc_b, bool accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " DECA_WGMMA_D32
               ", {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
               : DECA_WGMMA_F32(d, 0)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

// N = 16 with A from registers (the fragment above), B K-major: the MLA direct kernel's S^T = K Q^T
// and O^T = V^T P^T (kernels/mla/sm90/direct.cuh).
__device__ __forceinline__ void wgmma_m64n16k32_e4m3_rs(float* d, const unsigned (&a)[4], unsigned long long desc_b,
                                                        bool accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 " DECA_WGMMA_D8
               ", {%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
               : DECA_WGMMA_F8(d, 0)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

// wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 d, a-desc, b-desc, scale-d, 1, 1, 0, tnspB;
// A and B from shared memory (descriptors); `accumulate` false overwrites d (scale-d = 0).
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n256k16_ss(float (&d)[128], unsigned long long desc_a,
                                                   unsigned long long desc_b, bool accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " DECA_WGMMA_D128
               ", %128, %129, p, 1, 1, 0, %131;\n}\n"
               : DECA_WGMMA_F128(d)
               : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransB));
}

// wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 d, {a0, a1, a2, a3}, b-desc, scale-d, 1, 1, tnspB;
// A from registers (the m64k16 fragment: a0 rows r / cols 2c, a1 rows r+8, a2 cols 2c+8, a3 both),
// B from shared memory.
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[128], const unsigned (&a)[4],
                                                   unsigned long long desc_b, bool accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " DECA_WGMMA_D128
               ", {%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n"
               : DECA_WGMMA_F128(d)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)),
                 "n"(kTransB));
}

// wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 d, a-desc, b-desc, scale-d, 1, 1, 0, tnspB;
// half of wgmma_m64n256k16_ss (d[0..63] columns 0..127, d[64..127] 128..255), for the same reason
// as wgmma_m64n128k16_rs below.
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float* d, unsigned long long desc_a,
                                                   unsigned long long desc_b, bool accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " DECA_WGMMA_D64
               ", %64, %65, p, 1, 1, 0, %67;\n}\n"
               : DECA_WGMMA_F64(d, 0)
               : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransB));
}

// wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 d, {a0, a1, a2, a3}, b-desc, scale-d, 1, 1, tnspB;
// wgmma_m64n256k16_rs's columns 0..127 (d[0..63]) or 128..255 (d[64..127]). In a kernel of 512
// threads (128 registers at launch) ptxas refuses either m64n256k16 form whatever the setmaxnreg
// before it (C7602: a register target of 154 / 158); two of these compile.
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float* d, const unsigned (&a)[4],
                                                   unsigned long long desc_b, bool accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " DECA_WGMMA_D64
               ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
               : DECA_WGMMA_F64(d, 0)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)),
                 "n"(kTransB));
}

// ---- wgmma.mma_async with 16-bit operands of either type (PTX ISA 9.7.15.5.2) ------------------
// The Hopper GQA kernels for bf16 / fp16 caches (kernels/gqa/sm90/decode.cuh, decode_rows.cuh):
// Wgmma16<kF16> runs f16 x f16 when kF16, else bf16 x bf16, into f32; `accumulate` false
// overwrites d (scale-d = 0). Both operand types are the cache's.
#define DECA_WGMMA16_TY(kF16, stmt_f16, stmt_bf16) \
  if constexpr (kF16) {                            \
    stmt_f16;                                      \
  } else {                                         \
    stmt_bf16;                                     \
  }
template <bool kF16>
struct Wgmma16 {
  // wgmma.mma_async.sync.aligned.m64nNk16.f32.T.T d, a-desc, b-desc, scale-d, 1, 1, tnspA, 0;
  // N = 8 or 16 (d: N / 2 floats), A and B from shared memory, B K-major, A K-major or
  // (kTransA = 1) MN-major: the rows-on-N kernel's S^T = K q^T (A = K) and O^T = V^T P^T (A = V
  // as stored, d contiguous: MN-major).
  template <int N, int kTransA>
  static __device__ __forceinline__ void ss_n(float* d, unsigned long long desc_a, unsigned long long desc_b,
                                              bool accumulate) {
    static_assert(N == 8 || N == 16, "N");
    if constexpr (N == 8) {
#define DECA_W16_N8(TY)                                                                                  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"                                            \
               "wgmma.mma_async.sync.aligned.m64n8k16.f32." TY "." TY                                  \
               " {%0, %1, %2, %3}, %4, %5, p, 1, 1, %7, 0;\n}\n"                                        \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                        \
               : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransA))
      DECA_WGMMA16_TY(kF16, DECA_W16_N8("f16"), DECA_W16_N8("bf16"))
#undef DECA_W16_N8
    } else {
#define DECA_W16_N16(TY)                                                                                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"                                           \
               "wgmma.mma_async.sync.aligned.m64n16k16.f32." TY "." TY " " DECA_WGMMA_D8               \
               ", %8, %9, p, 1, 1, %11, 0;\n}\n"                                                        \
               : DECA_WGMMA_F8(d, 0)                                                                   \
               : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransA))
      DECA_WGMMA16_TY(kF16, DECA_W16_N16("f16"), DECA_W16_N16("bf16"))
#undef DECA_W16_N16
    }
  }

  // wgmma.mma_async.sync.aligned.m64n64k16.f32.T.T d, a-desc, b-desc, scale-d, 1, 1, 0, 0;
  // both K-major: the rows-on-M kernel's S = q K^T (64 operand rows x 64 tokens).
  static __device__ __forceinline__ void ss_n64(float (&d)[32], unsigned long long desc_a,
                                                unsigned long long desc_b, bool accumulate) {
#define DECA_W16_N64(TY)                                                                                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                           \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " DECA_WGMMA_D32              \
               ", %32, %33, p, 1, 1, 0, 0;\n}\n"                                                        \
               : DECA_WGMMA_F32(d, 0)                                                                  \
               : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)))
    DECA_WGMMA16_TY(kF16, DECA_W16_N64("f16"), DECA_W16_N64("bf16"))
#undef DECA_W16_N64
  }

  // wgmma.mma_async.sync.aligned.m64n32k16.f32.T.T d, a-desc, b-desc, scale-d, 1, 1, 0, 0;
  // both K-major: the rows-on-M kernel's S = q K^T at head_dim 256 (64 operand rows x 32 tokens).
  static __device__ __forceinline__ void ss_n32(float (&d)[16], unsigned long long desc_a,
                                                unsigned long long desc_b, bool accumulate) {
#define DECA_W16_N32(TY)                                                                                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                           \
               "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " " DECA_WGMMA_D16              \
               ", %16, %17, p, 1, 1, 0, 0;\n}\n"                                                        \
               : DECA_WGMMA_F8(d, 0), DECA_WGMMA_F8(d, 8)                                              \
               : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)))
    DECA_WGMMA16_TY(kF16, DECA_W16_N32("f16"), DECA_W16_N32("bf16"))
#undef DECA_W16_N32
  }

  // wgmma.mma_async.sync.aligned.m64n128k16.f32.T.T d, a-desc, b-desc, scale-d, 1, 1, 0, 0;
  // both K-major: the rows-on-M kernel's S = q K^T at head_dim 64 (64 operand rows x 128 tokens).
  static __device__ __forceinline__ void ss_n128(float (&d)[64], unsigned long long desc_a,
                                                 unsigned long long desc_b, bool accumulate) {
#define DECA_W16_N128SS(TY)                                                                              \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                           \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " DECA_WGMMA_D64             \
               ", %64, %65, p, 1, 1, 0, 0;\n}\n"                                                        \
               : DECA_WGMMA_F64(d, 0)                                                                  \
               : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)))
    DECA_WGMMA16_TY(kF16, DECA_W16_N128SS("f16"), DECA_W16_N128SS("bf16"))
#undef DECA_W16_N128SS
  }

  // wgmma.mma_async.sync.aligned.m64n64k16.f32.T.T d, {a0, a1, a2, a3}, b-desc, scale-d, 1, 1, 1;
  // rs_n128_tb below at N = 64: the rows-on-M kernel's O += P V at head_dim 64.
  static __device__ __forceinline__ void rs_n64_tb(float (&d)[32], const unsigned (&a)[4], unsigned long long desc_b,
                                                   bool accumulate) {
#define DECA_W16_N64RS(TY)                                                                               \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                           \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " DECA_WGMMA_D32              \
               ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                                          \
               : DECA_WGMMA_F32(d, 0)                                                                  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)))
    DECA_WGMMA16_TY(kF16, DECA_W16_N64RS("f16"), DECA_W16_N64RS("bf16"))
#undef DECA_W16_N64RS
  }

  // wgmma.mma_async.sync.aligned.m64n128k16.f32.T.T d, {a0, a1, a2, a3}, b-desc, scale-d, 1, 1, 1;
  // A from registers (the m64k16 fragment of wgmma_m64n16k16_rs), B MN-major (tnspB = 1): the
  // rows-on-M kernel's O += P V with V as stored (tokens on K, d contiguous).
  static __device__ __forceinline__ void rs_n128_tb(float (&d)[64], const unsigned (&a)[4], unsigned long long desc_b,
                                                    bool accumulate) {
#define DECA_W16_N128(TY)                                                                                \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                           \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " DECA_WGMMA_D64             \
               ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                          \
               : DECA_WGMMA_F64(d, 0)                                                                  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)))
    DECA_WGMMA16_TY(kF16, DECA_W16_N128("f16"), DECA_W16_N128("bf16"))
#undef DECA_W16_N128
  }

  // wgmma.mma_async.sync.aligned.m64n256k16.f32.T.T d, {a0, a1, a2, a3}, b-desc, scale-d, 1, 1, 1;
  // rs_n128_tb at N = 256: the rows-on-M kernel's O += P V at head_dim 256 (four column blocks
  // of V, LBO apart).
  static __device__ __forceinline__ void rs_n256_tb(float (&d)[128], const unsigned (&a)[4], unsigned long long desc_b,
                                                    bool accumulate) {
#define DECA_W16_N256(TY)                                                                                \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"                                          \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " " DECA_WGMMA_D128            \
               ", {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"                                     \
               : DECA_WGMMA_F128(d)                                                                    \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)))
    DECA_WGMMA16_TY(kF16, DECA_W16_N256("f16"), DECA_W16_N256("bf16"))
#undef DECA_W16_N256
  }
};
#undef DECA_WGMMA16_TY

#undef DECA_WGMMA_F8
#undef DECA_WGMMA_F32
#undef DECA_WGMMA_F64
#undef DECA_WGMMA_F128
#undef DECA_WGMMA_D8
#undef DECA_WGMMA_D16
#undef DECA_WGMMA_D32
#undef DECA_WGMMA_D64
#undef DECA_WGMMA_D128

}  // namespace deca::sm90
