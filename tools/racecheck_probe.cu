// What compute-sanitizer racecheck understands of named barriers, on a kernel that is race-free
// by the PTX memory model (barrier.arrive synchronizes with barrier.sync of the same barrier):
// warp 0 writes shared memory and signals, warp 1 waits and reads, then the roles swap for the
// write-after-read side, as deca's warp-specialized MLA kernel hands P's row factors over.
//   nvcc -arch=sm_90a -o /tmp/probe tools/racecheck_probe.cu
//   compute-sanitizer --tool racecheck /tmp/probe arrive|sync|syncthreads
// "arrive": one-way arrive -> sync (the MLA kernel's kBarPReady / kBarPFree pattern);
// "sync": both warps barrier.sync on one id with count 64 (its kBarEpilogue pattern);
// "syncthreads": __syncthreads() (barrier 0, whole CTA) as the control.
#include <cstdio>
#include <cstring>

__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("barrier.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}

__global__ void probe(int mode, float* out) {
  __shared__ float buf[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float acc = 0.f;
  for (int it = 0; it < 4; ++it) {
    if (mode == 0) {  // arrive/sync handoff both ways
      if (warp == 0) {
        if (it > 0) bar_sync(2, 64);  // warp 1 is done reading the previous value
        buf[lane] = static_cast<float>(it * 32 + lane);
        bar_arrive(1, 64);
      } else {
        bar_sync(1, 64);
        acc += buf[31 - lane];
        bar_arrive(2, 64);
      }
    } else if (mode == 1) {  // both sides sync
      if (warp == 0) buf[lane] = static_cast<float>(it * 32 + lane);
      if (warp == 0) bar_sync(1, 64); else bar_sync(1, 64);
      if (warp == 1) acc += buf[31 - lane];
      if (warp == 0) bar_sync(2, 64); else bar_sync(2, 64);
    } else {
      if (warp == 0) buf[lane] = static_cast<float>(it * 32 + lane);
      __syncthreads();
      if (warp == 1) acc += buf[31 - lane];
      __syncthreads();
    }
  }
  if (mode == 0 && warp == 0) bar_sync(2, 64);
  out[threadIdx.x] = acc;
}

int main(int argc, char** argv) {
  const char* m = argc > 1 ? argv[1] : "arrive";
  const int mode = !std::strcmp(m, "arrive") ? 0 : !std::strcmp(m, "sync") ? 1 : 2;
  float* out = nullptr;
  cudaMalloc(&out, 64 * sizeof(float));
  probe<<<1, 64>>>(mode, out);
  float h[64];
  cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
  // warp 1 lane l read (31 - l) + 32 it for it = 0..3: 4 (31 - l) + 192.
  int bad = 0;
  for (int l = 0; l < 32; ++l) bad += h[32 + l] != 4.f * (31 - l) + 192.f;
  std::printf("racecheck probe %s: %s\n", m, bad ? "WRONG" : "ok");
  return bad != 0;
}
