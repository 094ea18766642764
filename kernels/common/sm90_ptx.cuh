// PTX wrappers for the Hopper (sm_90a) kernels, one per instruction, each stating its PTX syntax
// and citing its section of the PTX ISA; mbarrier and fence.proxy.async come from CCCL's
// cuda::ptx (NVRTC-clean), what it does not have is written in the same manner. By family:
#pragma once

#include "kernels/common/sm90/cluster.cuh"  // clusters, st.async, cp.async.bulk(.tensor)
#include "kernels/common/sm90/convert.cuh"  // cvt: e4m3 -> f16, f16 -> f32, f32 -> bf16
#include "kernels/common/sm90/memory.cuh"   // ld.global.nc with cache hints, prefetch, st.shared, stmatrix
#include "kernels/common/sm90/sync.cuh"     // setmaxnreg, named barriers, mbarrier, fences
#include "kernels/common/sm90/wgmma.cuh"    // descriptors, fence / commit / wait, mma_async shapes
