// PTX wrappers for the Hopper (sm_90a) kernels: wgmma and its shared-memory descriptors, register
// reallocation, named barriers, programmatic dependent launch, non-coherent global loads with
// cache hints and the e4m3 conversion. One wrapper per instruction, each stating its PTX syntax.
// mbarrier and fence.proxy.async come from CCCL's cuda::ptx (NVRTC-clean); what it does not have
// is written here in the same manner. Everything here needs sm_90a (wgmma, setmaxnreg).
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

#undef DECA_WGMMA_F8
#undef DECA_WGMMA_F32
#undef DECA_WGMMA_F64
#undef DECA_WGMMA_F128
#undef DECA_WGMMA_D8
#undef DECA_WGMMA_D16
#undef DECA_WGMMA_D32
#undef DECA_WGMMA_D64
#undef DECA_WGMMA_D128

// ---- Register reallocation (PTX ISA 9.7.19.5, setmaxnreg, sm_90a) --------------------------------
// setmaxnreg.inc.sync.aligned.u32 N; / setmaxnreg.dec.sync.aligned.u32 N; -- warpgroup-wide.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---- Named barriers (PTX ISA 9.7.13.1, barrier) ---------------------------------------------------
// barrier.sync id, count;   -- arrive and wait until `count` threads (a multiple of 32) arrived.
// barrier.arrive id, count; -- arrive without waiting (the producer side of a one-way signal).
// Not the .aligned forms (bar.sync / bar.arrive): .aligned promises that every thread of the CTA
// executes the same barrier instruction, and warp-specialized roles meet on one id from different
// instructions (both consumers' epilogue sync, one side's arrive against the other's sync).
// compute-sanitizer synccheck reports that as "divergent thread(s) in block" (ab8afe3, H200).
__device__ __forceinline__ void named_bar_sync(int id, int count) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// barrier.red.and.pred out, id, count, in; -- barrier.sync that also returns whether `in` held
// in every one of the `count` threads: a decision all of them take alike (wgmma's .aligned
// instructions need the warpgroup's threads on one path).
__device__ __forceinline__ bool named_bar_all(int id, int count, bool in) {
  unsigned out;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbarrier.red.and.pred q, %2, %3, p;\nselp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(out)
      : "r"(static_cast<unsigned>(in)), "r"(id), "r"(count)
      : "memory");
  return out != 0;
}

// ---- mbarrier (through cuda::ptx, PTX ISA 9.7.13.15) ---------------------------------------------
using mbar_t = cuda::std::uint64_t;  // an mbarrier object in shared memory (8-byte aligned)
// mbarrier.init.shared::cta.b64 [addr], count;
__device__ __forceinline__ void mbar_init(mbar_t* bar, unsigned count) {
  cuda::ptx::mbarrier_init(bar, count);
}
// mbarrier.arrive.shared::cta.b64 state, [addr]; (release, cta scope)
__device__ __forceinline__ void mbar_arrive(mbar_t* bar) {
  (void)cuda::ptx::mbarrier_arrive(bar);
}
// mbarrier.try_wait.parity.shared::cta.b64 done, [addr], parity; in a loop until the phase with
// that parity has completed (acquire, cta scope).
__device__ __forceinline__ void mbar_wait(mbar_t* bar, unsigned parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}
// mbarrier.test_wait.parity.shared::cta.b64 done, [addr], parity; -- whether that phase has
// completed, without waiting (acquire, cta scope, when it has).
__device__ __forceinline__ bool mbar_test(mbar_t* bar, unsigned parity) {
  return cuda::ptx::mbarrier_test_wait_parity(bar, parity);
}
// The same at cluster scope (mbar_wait_cluster's test).
__device__ __forceinline__ bool mbar_test_cluster(mbar_t* bar, unsigned parity) {
  return cuda::ptx::mbarrier_test_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cluster, bar, parity);
}
// mbarrier.arrive.expect_tx.release.cluster.shared::cta.b64 state, [addr], tx_count; -- one
// arrival that also raises the phase's expected transaction bytes (completed by another CTA's
// st.async, hence the cluster scope).
__device__ __forceinline__ void mbar_arrive_expect_tx(mbar_t* bar, unsigned bytes) {
  (void)cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cluster,
                                             cuda::ptx::space_shared, bar, bytes);
}
// mbarrier.arrive.release.cluster.shared::cluster.b64 _, [addr]; -- arrival on a barrier of
// another CTA of the cluster (`addr` from mapa).
__device__ __forceinline__ void mbar_arrive_cluster(unsigned cluster_addr) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_addr)
               : "memory");
}
// mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [addr]; -- the same arrival without
// the release: no ordering of this thread's earlier memory operations, so no MEMBAR.ALL.GPU in
// front of it (the release form costs one per arrival). For "I finished reading my tile"
// signals whose reads were already completed (wgmma.wait_group) before the arrival issues.
__device__ __forceinline__ void mbar_arrive_cluster_relaxed(unsigned cluster_addr) {
  asm volatile("mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_addr)
               : "memory");
}
// mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [addr], parity; in a loop: for
// barriers that other CTAs of the cluster arrive on or complete bytes on (their writes, and the
// reads they finished before arriving, are ordered before what follows).
__device__ __forceinline__ void mbar_wait_cluster(mbar_t* bar, unsigned parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cluster, bar,
                                              parity)) {
  }
}
// mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 state, [addr], tx_count; -- as
// mbar_arrive_expect_tx at CTA scope (no MEMBAR.ALL.GPU): the bytes that complete the phase are
// counted by the barrier whatever the scope of this arrival.
__device__ __forceinline__ void mbar_arrive_expect_tx_cta(mbar_t* bar, unsigned bytes) {
  (void)cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta,
                                             cuda::ptx::space_shared, bar, bytes);
}
// fence.mbarrier_init.release.cluster; -- makes the inits visible before any other thread
// (or the async proxy) uses the barriers.
__device__ __forceinline__ void fence_mbar_init() {
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
}
// fence.proxy.async.shared::cta; -- generic-proxy writes to shared memory become visible to the
// async proxy (wgmma reads its shared operands through it).
__device__ __forceinline__ void fence_proxy_async_smem() {
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
}

// ---- Thread-block clusters (PTX ISA 9.7.13.4 barrier.cluster, 9.7.9.24 mapa, 9.7.9.12 st.async) --
// %cluster_ctarank through cuda::ptx.
__device__ __forceinline__ unsigned cluster_ctarank() { return cuda::ptx::get_sreg_cluster_ctarank(); }
// barrier.cluster.arrive.release; barrier.cluster.wait.acquire; -- every thread of every CTA of
// the cluster; also a barrier for the CTA's own threads.
__device__ __forceinline__ void cluster_sync() {
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);
  cuda::ptx::barrier_cluster_wait(cuda::ptx::sem_acquire);
}
// barrier.cluster.arrive.relaxed; barrier.cluster.wait.acquire; -- the same rendezvous without
// ordering this thread's earlier memory accesses: after fence.mbarrier_init (which makes the
// barrier inits visible to the cluster by itself), so that loads issued before it need not
// complete first.
__device__ __forceinline__ void cluster_sync_relaxed() {
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_relaxed);
  cuda::ptx::barrier_cluster_wait(cuda::ptx::sem_acquire);
}
// mapa.shared::cluster.u32 d, a, rank; -- the address of `a` (shared::cta) in CTA `rank`'s
// window; a CTA's window is contiguous, so the result minus `a` is a constant offset.
__device__ __forceinline__ unsigned mapa_shared(unsigned smem_addr, unsigned rank) {
  unsigned d;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(d) : "r"(smem_addr), "r"(rank));
  return d;
}
// st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [addr], {a, b, c, d}, [mbar];
// -- 16 bytes into another CTA's shared memory; the 16 bytes complete on that CTA's mbarrier,
// whose waiters then see the data.
__device__ __forceinline__ void st_async_v4(unsigned cluster_addr, uint4 v, unsigned cluster_mbar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(
          cluster_addr),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(cluster_mbar)
      : "memory");
}

// cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [dst], [src], size, [mbar];
// -- `size` bytes (a multiple of 16, both addresses 16-byte aligned) of this CTA's shared memory
// copied by the bulk-copy unit into another CTA's, completing on that CTA's mbarrier. (CCCL's
// cuda::ptx::cp_async_bulk takes generic pointers; the kernels hold 32-bit shared::cluster
// addresses from mapa.) The source must be visible to the async proxy: fence.proxy.async after
// the generic stores, and a barrier between the storing threads and the issuing one.
__device__ __forceinline__ void bulk_copy_to_peer(unsigned cluster_dst, unsigned smem_src, unsigned bytes,
                                                  unsigned cluster_mbar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          cluster_dst),
      "r"(smem_src), "r"(bytes), "r"(cluster_mbar)
      : "memory");
}

// cp.async.bulk.global.shared::cta.bulk_group [dst], [src], bytes; -- shared -> global by the
// bulk-copy unit (16-byte aligned, a multiple of 16 bytes), then commit_group and
// wait_group.read 0: the copies' reads of shared memory done (their global writes complete with
// the grid). The copy itself written here for a shared-window address (CCCL's takes a generic
// pointer); commit and wait through cuda::ptx.
__device__ __forceinline__ void bulk_store_global(void* dst, unsigned smem_src, unsigned bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(smem_src), "r"(bytes)
               : "memory");
}
// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], bytes, [mbar];
// -- global -> this CTA's shared memory by the bulk-copy unit (both 16-byte aligned, a multiple
// of 16 bytes), completing `bytes` of the mbarrier's transaction count. Shared-window addresses
// (this CTA's are valid shared::cluster ones).
__device__ __forceinline__ void bulk_load_shared(unsigned smem_dst, const void* src, unsigned bytes,
                                                 unsigned smem_mbar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_dst),
      "l"(src), "r"(bytes), "r"(smem_mbar)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() { cuda::ptx::cp_async_bulk_commit_group(); }
__device__ __forceinline__ void bulk_wait_read() { cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{}); }

// ---- Programmatic dependent launch (PTX ISA 9.7.13.13, griddepcontrol, sm_90) --------------------
// griddepcontrol.launch_dependents; -- the dependent grid may start once every CTA executed this
// (or exited); its griddepcontrol.wait still waits for this grid's memory to be flushed.
__device__ __forceinline__ void launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
// griddepcontrol.wait; -- waits for the prerequisite grids to complete and their memory to be
// visible (a no-op without programmatic dependent launch).
__device__ __forceinline__ void grid_dependency_wait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

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

// ---- Conversions (PTX ISA 9.7.9.21, cvt) ---------------------------------------------------------
// cvt.rn.f16x2.e4m3x2 d, a; -- two e4m3 (low byte -> low half) to two f16, exact (sm_89+).
__device__ __forceinline__ unsigned e4m3x2_to_f16x2(unsigned short pair) {
  unsigned d;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(d) : "h"(pair));
  return d;
}
// The same for the four e4m3 of a word (byte i = value i): values 0, 1 and 2, 3 as two f16x2; the
// high pair is read as the register's upper half, without a shift.
__device__ __forceinline__ uint2 e4m3x4_to_f16x4(unsigned w) {
  unsigned lo, hi;
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
  return make_uint2(lo, hi);
}
// mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 with C = 0, not volatile (a pure function of
// its operands, scheduled freely). A (16 x 8, row-major): a0 = row g, k 2c and 2c + 1 (g = lane / 4,
// c = lane % 4), a1 = row g + 8; B (8 x 8, column-major): b = k 2c, 2c + 1 of column g; D: d0, d1
// = row g, columns 2c, 2c + 1; d2, d3 = row g + 8.
__device__ __forceinline__ void mma_f16_1688_zero(float (&d)[4], unsigned a0, unsigned a1, unsigned b) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
      "{%7, %7, %7, %7};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(b), "f"(0.f));
}
// cvt.f32.f16 d, a; for both halves of an f16x2 (exact).
__device__ __forceinline__ float2 f16x2_to_f32x2(unsigned h2) {
  float lo, hi;
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.f32.f16 %0, l;\ncvt.f32.f16 %1, h;\n}\n"
      : "=f"(lo), "=f"(hi)
      : "r"(h2));
  return make_float2(lo, hi);
}
// cvt.rn.bf16x2.f32 d, hi, lo; -- `lo` lands in the low half.
__device__ __forceinline__ unsigned f32x2_to_bf16x2(float lo, float hi) {
  unsigned d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
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

}  // namespace deca::sm90
