// Shared-memory helpers of the e4m3 wgmma tiles (the tile probe fp8_tile.cuh and the kernel
// decode.cuh): narrow stores and the 4 x 4 byte transpose that turns token rows of V into the
// K-major V^T rows 8-bit wgmma operands need (the layouts themselves: layout.cuh).
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/gqa/sm90/layout.cuh"

namespace deca::gqa::sm90 {

__device__ __forceinline__ void sts8(unsigned addr, unsigned v) {
  asm volatile("st.shared.u8 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void sts16(unsigned addr, unsigned v) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(static_cast<unsigned short>(v)) : "memory");
}

// Rows of four tokens' four bytes (w[j] = token j, bytes = d) -> words of four tokens' bytes for
// each of the four d (out[i] = d i, byte j = token j).
__device__ __forceinline__ void transpose4x4(const unsigned (&w)[4], unsigned (&out)[4]) {
  const unsigned t0 = ptx::prmt(w[0], w[1], 0x5140u);  // w0.b0 w1.b0 w0.b1 w1.b1
  const unsigned t1 = ptx::prmt(w[2], w[3], 0x5140u);
  const unsigned t2 = ptx::prmt(w[0], w[1], 0x7362u);  // w0.b2 w1.b2 w0.b3 w1.b3
  const unsigned t3 = ptx::prmt(w[2], w[3], 0x7362u);
  out[0] = ptx::prmt(t0, t1, 0x5410u);
  out[1] = ptx::prmt(t0, t1, 0x7632u);
  out[2] = ptx::prmt(t2, t3, 0x5410u);
  out[3] = ptx::prmt(t2, t3, 0x7632u);
}

}  // namespace deca::gqa::sm90
