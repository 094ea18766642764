// Rates of the MLA sparse kernel's pieces in isolation on one SM (every SM runs the same CTA):
// the consumers' wgmma phases (QK^T at N = 64 and 128, P V, both warpgroups at once, QK^T split
// over the two) and the producers' e4m3 -> bf16 conversion from shared memory by W warps. Numbers
// for docs/perf-notes-mla.md: what a block costs at best, against the kernel's 4330 clk per block
// (consumers alone, b128 h128) and 5300 (producers alone, b128 h64).
//   nvcc -std=c++17 -arch=sm_90a -I. -o /tmp/wgmma_probe tools/wgmma_probe.cu && /tmp/wgmma_probe
#include <cstdio>
#include <vector>
#include <algorithm>
#include <utility>

#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/sm90/dequant.cuh"

using namespace deca::sm90;

constexpr int kChunk = 64 * 128;  // one 64-row x 128 B swizzled chunk
constexpr int kIters = 64;

enum Mode : int {
  kQk1 = 0,      // WG0: S = Q K^T, 36 x m64n64k16 SS
  kQk2,          // WG0 and WG1 each their own QK^T
  kPv1,          // WG0: 4 x m64n256k16 RS
  kPv2,          // WG0 and WG1 each 4 x m64n256k16 RS
  kQkN128,       // WG0: 36 x m64n128k16 SS (128 tokens)
  kQkSplit,      // WG0 k steps 0..17, WG1 18..35
  kBlock,        // WG0 QK^T then P V; WG1 P V beside WG0's (named barrier after QK^T)
  kQk1Stores,    // kQk1 with WG2 storing 16 B units into shared memory meanwhile
  kQkN256,       // WG0: 36 x m64n256k16 SS (256 tokens)
  kPvK,          // WG0: P V with V read K-major (tnspB 0: wrong numbers, the rate of the other layout)
  kPvSs1,        // WG0: P V with P from shared memory too (consumer 1's form)
  kConvert,      // W warps: 2 x 8 B e4m3 + scale from smem -> 2 x 16 B bf16 stores (dequant8)
  kModes
};

__device__ __forceinline__ unsigned long long clk() {
  unsigned long long c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c));
  return c;
}

__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long c;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(c));
  return c;
}

__device__ __forceinline__ void qk(float (&s)[32], unsigned q, unsigned k, int kk0, int kk1) {
  wgmma_fence();
  const unsigned long long dq = smem_desc_sw128(q, 16, 1024);
  const unsigned long long dk = smem_desc_sw128(k, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < 36; ++kk) {
    if (kk < kk0 || kk >= kk1) continue;
    const unsigned off = (kk >> 2) * kChunk + (kk & 3) * 32;
    wgmma_m64n64k16_ss<0>(s, desc_advance(dq, off), desc_advance(dk, off), kk > kk0);
  }
  wgmma_commit();
}

// QK^T over N = 128 or 256 tokens of K (rows past the first 64 of a chunk run into the next
// chunk's: other finite numbers, the same rate); k steps kk / 4 apart by 2 KB for N = 256 so
// that its 32 KB rows stay inside the 216 KB.
template <int N>
__device__ __forceinline__ void qk_wide(float (&o)[128], unsigned q, unsigned k) {
  wgmma_fence();
  const unsigned long long dq = smem_desc_sw128(q, 16, 1024);
  const unsigned long long dk = smem_desc_sw128(k, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < 36; ++kk) {
    const unsigned off = (kk >> 2) * (N == 128 ? kChunk : 2048) + (kk & 3) * 32;
    if constexpr (N == 128) {
      wgmma_m64n128k16_ss<0>(o, desc_advance(dq, off), desc_advance(dk, off), kk > 0);
    } else {
      wgmma_m64n256k16_ss<0>(o, desc_advance(dq, off), desc_advance(dk, off), kk > 0);
    }
  }
  wgmma_commit();
}

// P V as the kernel's defaults issue it with two producer warpgroups: consumer 0 with P from
// registers, consumer 1 with P from shared memory, each as two m64n128k16 per k step.
template <int kTrans = 1>
__device__ __forceinline__ void pv(float (&o)[128], const unsigned (&pa)[4], unsigned v) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    wgmma_m64n128k16_rs<kTrans>(o, pa, smem_desc_sw128(v + 2048 * kk, kChunk, 1024), true);
    wgmma_m64n128k16_rs<kTrans>(o + 64, pa, smem_desc_sw128(v + 2 * kChunk + 2048 * kk, kChunk, 1024), true);
  }
  wgmma_commit();
}
__device__ __forceinline__ void pv_ss(float (&o)[128], unsigned p, unsigned v) {
  wgmma_fence();
  const unsigned long long dp = smem_desc_sw128(p, 16, 1024);
  const unsigned long long dv = smem_desc_sw128(v, kChunk, 1024);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    wgmma_m64n128k16_ss<1>(o, desc_advance(dp, 32 * kk), desc_advance(dv, 2048 * kk), true);
    wgmma_m64n128k16_ss<1>(o + 64, desc_advance(dp, 32 * kk), desc_advance(dv, 2 * kChunk + 2048 * kk), true);
  }
  wgmma_commit();
}

template <int mode>
__global__ void __launch_bounds__(384, 1) probe(int warps, unsigned long long* out, float* sink, int ones) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const unsigned base = (static_cast<unsigned>(__cvta_generic_to_shared(smem)) + 1023u) & ~1023u;
  const unsigned q = base, k = base + 9 * kChunk;  // Q 72 KB, K 144 KB (128 rows for kQkN128)
  // Small finite bf16 everywhere (1/64 .. 1/32), so that the tensor cores see real numbers.
  for (unsigned i = threadIdx.x; i < 27 * kChunk / 4; i += blockDim.x) {
    sts32(base + 4 * i, ones ? 0x3F803F80u : 0x3C803C80u ^ ((i * 2654435761u) & 0x001F001Fu));
  }
  __syncthreads();
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  const int t = threadIdx.x;
  unsigned long long t0 = 0, t1 = 0, g0 = 0, g1 = 0;
  float acc = 0.f;
  if constexpr (mode == kConvert) {
    // Each active thread: pieces of 16 B e4m3 (two 8 B halves) + a scale -> two 16 B bf16.
    setmaxnreg_dec<160>();
    if ((t >> 5) < warps) {
      const unsigned raw = base + 16 * (t & 255);  // 4 KB of e4m3 read round and round
      const unsigned dst = base + 8 * kChunk + 32 * t;
      t0 = clk();
      for (int it = 0; it < kIters * 8; ++it) {
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          uint2 a, b;
          float sc;
          asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(a.x), "=r"(a.y) : "r"(raw + 4096 * (u & 1) + 512 * u));
          asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(b.x), "=r"(b.y) : "r"(raw + 4096 * (u & 1) + 512 * u + 8));
          asm volatile("ld.shared.f32 %0, [%1];" : "=f"(sc) : "r"(base + 4 * (t & 31) + 128 * u));
          sts128(dst + 12288 * (u & 3), deca::mla::sm90::dequant8_as<false, true>(a, sc));
          sts128(dst + 12288 * (u & 3) + 16, deca::mla::sm90::dequant8_as<false, true>(b, sc));
        }
      }
      t1 = clk();
    }
    named_bar_sync(1, 384);
  } else if (wg == 0) {
    setmaxnreg_inc<200>();
    float s[32] = {}, o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    unsigned pa[4] = {0x3C803C80u, 0x3C803C80u, 0x3C803C80u, 0x3C803C80u};
    named_bar_sync(1, 384);
    g0 = gtime();
    t0 = clk();
    for (int it = 0; it < kIters; ++it) {
      if constexpr (mode == kPv1 || mode == kPv2 || mode == kPvK) {
        pv<mode == kPvK ? 0 : 1>(o, pa, k);
        wgmma_wait<0>();
        fence_regs(o);
      } else if constexpr (mode == kPvSs1) {
        pv_ss(o, q, k);
        wgmma_wait<0>();
        fence_regs(o);
      } else if constexpr (mode == kQkN128 || mode == kQkN256) {
        qk_wide<mode == kQkN128 ? 128 : 256>(o, q, k);
        wgmma_wait<0>();
        fence_regs(o);
      } else {
        qk(s, q, k, 0, mode == kQkSplit ? 18 : 36);
        wgmma_wait<0>();
        fence_regs(s);
        if constexpr (mode == kBlock) {
          named_bar_arrive(2, 256);
          unsigned pb[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) pb[i] = f32x2_to_bf16x2(s[8 * i] * 1e-3f, s[8 * i + 1] * 1e-3f);
          pv(o, pb, k);
          wgmma_wait<0>();
          fence_regs(o);
        }
      }
      acc += s[0];
    }
    t1 = clk();
    g1 = gtime();
    // With every operand 1.0, S = 576 (the sum over the 36 k steps of 16): that all the work ran.
    if (ones && t == 0) sink[blockIdx.x] = mode == kQkN128 || mode == kQkN256 ? o[0] + o[63] : s[0] + s[31];
    for (int i = 0; i < 128; ++i) acc += o[i];
    named_bar_sync(1, 384);
  } else if (wg == 1) {
    setmaxnreg_dec<160>();
    float s[32] = {}, o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    unsigned pa[4] = {0x3C803C80u, 0x3C803C80u, 0x3C803C80u, 0x3C803C80u};
    named_bar_sync(1, 384);
    t0 = clk();
    if constexpr (mode == kQk2 || mode == kQkSplit || mode == kPv2 || mode == kBlock) {
      for (int it = 0; it < kIters; ++it) {
        if constexpr (mode == kPv2) {
          pv_ss(o, q, k + 4 * kChunk);
          wgmma_wait<0>();
          fence_regs(o);
        } else if constexpr (mode == kBlock) {
          named_bar_sync(2, 256);
          pv_ss(o, q, k + 4 * kChunk);
          wgmma_wait<0>();
          fence_regs(o);
        } else {
          qk(s, q, k, mode == kQkSplit ? 18 : 0, 36);
          wgmma_wait<0>();
          fence_regs(s);
          acc += s[0];
        }
      }
    }
    t1 = clk();
    for (int i = 0; i < 128; ++i) acc += o[i];
    named_bar_sync(1, 384);
  } else {
    setmaxnreg_dec<144>();
    named_bar_sync(1, 384);
    t0 = clk();
    if constexpr (mode == kQk1Stores) {
      // 72 KB of 16-byte stores per 2176 clk, the producers' tile per block, for as long as
      // WG0 runs (about kIters QK^Ts): 64 x 18 rounds of 128 x 16 B.
      const unsigned dst = base + 18 * kChunk + 16 * t;
      for (int it = 0; it < kIters * 36; ++it) {
#pragma unroll
        for (int u = 0; u < 4; ++u) sts128(dst + 2048 * u, make_uint4(it, u, t, 0));
      }
    }
    t1 = clk();
    named_bar_sync(1, 384);
  }
  if ((t & 127) == 0 || (mode == kConvert && t == 0)) out[blockIdx.x * 3 + wg] = t1 - t0;
  if (t == 0) out[gridDim.x * 3 + blockIdx.x] = g1 - g0;
  if (acc == 12345.f) sink[1024 + t] = acc;
}

using Kernel = void (*)(int, unsigned long long*, float*, int);
template <int... M>
constexpr Kernel pick(int mode, std::integer_sequence<int, M...>) {
  Kernel k = nullptr;
  ((mode == M ? (k = probe<M>, 0) : 0), ...);
  return k;
}

int main() {
  const char* names[kModes] = {"qk1",      "qk2",       "pv1",  "pv2",    "qk_n128", "qk_split",
                               "block",    "qk1+stores", "qk_n256", "pv_kmajor", "pv_ss1", "convert"};
  // Multiply-adds per iteration of WG0 (the rate check against the tensor cores' peak).
  const double macs[kModes] = {36.0 * 64 * 64 * 16,  36.0 * 64 * 64 * 16, 8.0 * 64 * 128 * 16, 8.0 * 64 * 128 * 16,
                               36.0 * 64 * 128 * 16, 18.0 * 64 * 64 * 16, 0, 36.0 * 64 * 64 * 16,
                               36.0 * 64 * 256 * 16, 8.0 * 64 * 128 * 16, 8.0 * 64 * 128 * 16, 0};
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int smem = 27 * kChunk + 1024;
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  std::printf("SMs %d, clock attribute %d MHz\n", sms, clock_khz / 1000);
  unsigned long long* out;
  float* sink;
  cudaMalloc(&out, sms * 4 * sizeof(unsigned long long));
  cudaMalloc(&sink, 2048 * sizeof(float));
  std::vector<unsigned long long> h(sms * 4);
  for (int mode = 0; mode < kModes; ++mode) {
    const Kernel kern = pick(mode, std::make_integer_sequence<int, kModes>{});
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    const int nw = mode == kConvert ? 4 : 1;
    for (int wi = 0; wi < nw; ++wi) {
      const int warps = 4 * (wi + 1);
      if (mode == kQk1 || mode == kQkN128 || mode == kQkN256) {
        kern<<<sms, 384, smem>>>(warps, out, sink, 1);
        float check = 0.f;
        cudaMemcpy(&check, sink, sizeof(float), cudaMemcpyDeviceToHost);
        std::printf("%-11s with ones: S[0][0] + S[0][last] = %.1f (expected 1152)\n", names[mode], check);
      }
      kern<<<sms, 384, smem>>>(warps, out, sink, 0);  // warm-up
      kern<<<sms, 384, smem>>>(warps, out, sink, 0);
      if (cudaDeviceSynchronize() != cudaSuccess) {
        std::printf("%s: %s\n", names[mode], cudaGetErrorString(cudaGetLastError()));
        return 1;
      }
      cudaMemcpy(h.data(), out, h.size() * sizeof(h[0]), cudaMemcpyDeviceToHost);
      for (int wg = 0; wg < 3; ++wg) {
        std::vector<unsigned long long> v;
        for (int b = 0; b < sms; ++b) v.push_back(h[b * 3 + wg]);
        std::sort(v.begin(), v.end());
        const double med = static_cast<double>(v[v.size() / 2]);
        if (mode == kConvert) {
          if (wg > 0) continue;
          // values per clk per SM: warps x 32 threads x 8 pieces x 16 values per round
          const double values = static_cast<double>(warps) * 32 * kIters * 8 * 8 * 16;
          std::printf("%-11s warps %2d: %8.0f clk, %.2f values/clk/SM (%.0f clk per 64 x 512 values)\n",
                      names[mode], warps, med, values / med, 64.0 * 512 / (values / med));
        } else {
          if (med == 0) continue;
          std::printf("%-11s WG%d: %8.1f clk per iteration (min %llu max %llu per %d)", names[mode], wg,
                      med / kIters, v.front() / kIters, v.back() / kIters, kIters);
          if (wg == 0 && macs[mode] > 0) {
            std::vector<unsigned long long> ns(h.begin() + sms * 3, h.begin() + sms * 4);
            std::sort(ns.begin(), ns.end());
            // clk per ns from the CTA's whole time is not exact; the MAC rate per clk is.
            const double tns = static_cast<double>(ns[ns.size() / 2]);
            std::printf(", %.0f MAC/clk/SM, %.0f MHz, %.0f TFLOP/s over %d SMs", macs[mode] * kIters / med,
                        med / tns * 1e3, 2 * macs[mode] * kIters * sms / tns / 1e3, sms);
          }
          std::printf("\n");
        }
      }
    }
  }
  return 0;
}
