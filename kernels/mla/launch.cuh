// Launch shapes of the MLA scheduler and combine kernels (kernels/mla/schedule/entry.cuh,
// kernels/mla/combine/combine.cuh), shared by every decode kernel's host side. Host-compilable.
#pragma once

namespace deca::mla {

// The combine kernels: one warp per output row.
inline constexpr int kCombineWarps = 8;
inline constexpr int kCombineThreads = 32 * kCombineWarps;
// The split combine (a plan's choice, src/plan/mla_combine.hpp): one CTA per row, a warp per 128
// value dims.
inline constexpr int kCombineSplitWarps = 4;
inline constexpr int kCombineSplitThreads = 32 * kCombineSplitWarps;

// The scheduler kernel: one thread walks, all run the rest.
inline constexpr int kScheduleThreads = 128;
inline constexpr int kScheduleSmemLimit = 48 * 1024;  // staged in shared memory up to this

}  // namespace deca::mla
