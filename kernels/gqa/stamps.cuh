// Phase stamps of the Hopper GQA decode kernels (a timing aid; deca-bench --stamps). The stamp
// build of a kernel (GqaKernelKey::stamps, "_stamp") is generated with `#define DECA_GQA_STAMPS 1`
// before its entry header: thread 0 of every CTA then writes the %globaltimer (ns) of each event
// below, its %smid, blockIdx and tile count into its record of deca_gqa_stamps, a module global
// the host reads with cuModuleGetGlobal after the launch (src/cuda/gqa_stamps.cpp). Every other
// kernel's source, cache key and machine code stay as they were: without the macro the calls
// below are empty inline functions and no global exists.
// A macro rather than a Cfg member (kernels/common/cfg_field.cuh) because the buffer is a
// namespace-scope definition that only the stamp modules may hold; Traits read it as kStamps.
// A module global rather than a GqaParams field: a new field would move every kernel's parameter
// offsets. One launch at a time writes it (the stamp build runs only from deca-bench and tests).
// Not printf: a call in the kernel makes ptxas serialize every wgmma.
// Host-compilable: the record layout below is what the host decodes.
#pragma once

#ifndef DECA_GQA_STAMPS
#define DECA_GQA_STAMPS 0
#endif

namespace deca::gqa {

inline constexpr bool kStampBuild = DECA_GQA_STAMPS != 0;

// The events, in the order a split CTA of the rows-on-M kernel (decode_rows.cuh) meets them; the
// rows-on-N kernel (decode.cuh) issues its first copies before it converts q, so kIssued comes
// before kQ there: check the order pairwise, not in full.
// Where each is taken and why there:
//  kEntry: the kernel's first instruction, before griddepcontrol.wait (sm90/entry.cuh).
//  kWaited: right after griddepcontrol.wait: the previous grid's completion seen.
//  kQ: q's rows converted and in shared memory (this thread's shared stores are issued, so its
//      q loads are back).
//  kIssued: the first kStages - 1 tiles' copies issued: each copy's address needs the length and
//      its page id, so this is the prologue's loads back plus the issue (this thread's share).
//  kFirstTile: tile 0 landed for the whole CTA (after the first wait on the ring and its
//      barrier). Not reached by a CTA whose split has no tile.
//  kLastPv: the last tile's PV done (its wgmma waited for), the ring drained next.
//  kOut: split: after the arrival atomic and the barrier that shares its result (the partial is
//      published); no split: the output and LSE stores issued by every thread.
//  kMergeWeights: the merging CTA only: every split's (max, sum) read and turned into weights.
//  kMergeEnd: the merging CTA only: every thread's output stores issued.
enum StampEvent : int {
  kStampEntry = 0,
  kStampWaited,
  kStampQ,
  kStampIssued,
  kStampFirstTile,
  kStampLastPv,
  kStampOut,
  kStampMergeWeights,
  kStampMergeEnd,
  kStampEvents
};

// One CTA's record: 16 words (128 bytes, one line, so CTAs never share one). An event not reached
// stays 0 (the host clears the buffer before the launch).
inline constexpr int kStampWords = 16;
inline constexpr int kStampSmWord = 12;     // %smid
inline constexpr int kStampBlockWord = 13;  // blockIdx.x | y << 16 | z << 32
inline constexpr int kStampTilesWord = 14;  // tiles of the CTA's split, plus one (0: not written)
// Records for the first kStampCtas CTAs in linear order (x fastest); CTAs past them write none.
inline constexpr int kStampCtas = 1 << 15;
// After the records: the marks of deca_gqa_stamp_mark (the host launches it just before and just
// after the stamped kernel), so the launch gap is read in the same clock as the stamps.
inline constexpr int kStampMarks = 2;
inline constexpr long long kStampBufferWords = static_cast<long long>(kStampCtas) * kStampWords + kStampMarks;

}  // namespace deca::gqa

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#include "kernels/common/ptx.cuh"

#if DECA_GQA_STAMPS
extern "C" {
__device__ unsigned long long deca_gqa_stamps[deca::gqa::kStampBufferWords];
}

// One thread writes the timer into mark `slot`: launched alone just before (slot 0) and after
// (slot 1) the stamped kernel. Its stamp is its last act, so slot 0 to the first entry is the
// gap from the previous kernel's end to the first CTA.
extern "C" __global__ void deca_gqa_stamp_mark(int slot) {
  deca_gqa_stamps[static_cast<long long>(deca::gqa::kStampCtas) * deca::gqa::kStampWords + slot] =
      deca::ptx::globaltimer();
}
#endif

namespace deca::gqa {

#if DECA_GQA_STAMPS
// This CTA's record, or null past kStampCtas. Recomputed at every stamp, so nothing stays live
// in registers across the kernel for it.
__device__ __forceinline__ unsigned long long* stamp_record() {
  const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  return cta < static_cast<unsigned>(kStampCtas) ? deca_gqa_stamps + static_cast<long long>(cta) * kStampWords
                                                 : nullptr;
}
__device__ __forceinline__ unsigned long long stamp_now() { return ptx::globaltimer(); }
// Thread 0 writes `value` into word `word` of its record.
__device__ __forceinline__ void stamp_word(int word, unsigned long long value) {
  if (threadIdx.x == 0) {
    if (unsigned long long* r = stamp_record()) r[word] = value;
  }
}
__device__ __forceinline__ void stamp(int event) { stamp_word(event, ptx::globaltimer()); }
// The entry, read before griddepcontrol.wait, stored after it (no global store before the wait),
// with the CTA's SM and coordinates; then kWaited.
__device__ __forceinline__ void stamp_entry(unsigned long long t_entry) {
  const unsigned long long t_waited = ptx::globaltimer();
  if (threadIdx.x == 0) {
    if (unsigned long long* r = stamp_record()) {
      r[kStampEntry] = t_entry;
      r[kStampWaited] = t_waited;
      r[kStampSmWord] = ptx::smid();
      r[kStampBlockWord] = blockIdx.x | static_cast<unsigned long long>(blockIdx.y) << 16 |
                           static_cast<unsigned long long>(blockIdx.z) << 32;
    }
  }
}
// An event that needs every thread's work before it (the last stores): a barrier first, only in
// the stamp build.
__device__ __forceinline__ void stamp_all(int event) {
  __syncthreads();
  stamp(event);
}
#else
__device__ __forceinline__ unsigned long long stamp_now() { return 0; }
__device__ __forceinline__ void stamp_word(int, unsigned long long) {}
__device__ __forceinline__ void stamp(int) {}
__device__ __forceinline__ void stamp_entry(unsigned long long) {}
__device__ __forceinline__ void stamp_all(int) {}
#endif

}  // namespace deca::gqa

#endif
