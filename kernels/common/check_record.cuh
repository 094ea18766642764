// Checked mode (issue 9): where a kernel built with Cfg::kChecked records the first index it found
// out of range in device memory (a page id, a sequence length, a sparse token id, a top-k length).
// Host code cannot see those indices without a copy and a synchronisation, so the kernels test
// them as they read them, never dereference a bad one (the key is masked: it contributes nothing),
// and leave one record here for the host (deca::check_gqa_run / check_mla_run) to turn into a
// deca::Error naming the argument, the entry, the bound and the value.
//
// The record is 32 bytes in the last kCheckBytes of a checked plan's workspace, zero when clean.
// "First" is the first thread whose atomicCAS takes `claimed`: when several entries are bad, which
// one is reported depends on scheduling, but the record always describes one real offender
// completely (only the thread that claimed it writes the other words). The host reads it after a
// stream synchronisation and zeroes it again. No includes: host compiler, nvcc and NVRTC alike.
#pragma once

namespace deca {

enum CheckKind : unsigned {
  kCheckClean = 0,
  kCheckPageId = 1,      // GQA page_table / MLA dense block_table [request][position] = value,
                         // not in [lo, hi)
  kCheckSeqLen = 2,      // GQA seq_lens[request] = value, not 0 nor in [lo, hi]
  kCheckIndex = 3,       // MLA indices[request][token][position] = value, not -1 nor in [lo, hi)
  kCheckTopkLength = 4,  // MLA topk_length / dense cache_seqlens [request] = value, not in [lo, hi]
  kCheckSchedule = 5,    // MLA reuse_schedule: the workspace's schedule was for batch = request,
                         // q_len = token, topk = position, num_parts = value, topk_length = hi
  kCheckExtraIndex = 6,  // MLA MODEL1 extra_indices[request][token][position] = value, not -1 nor
                         // in [lo, hi) (extra_num_blocks * extra_page_size)
  kCheckExtraTopkLength = 7,  // MLA MODEL1 extra_topk_length[request] = value, not in [lo, hi]
  kCheckPosition = 8,    // GQA fused step: the rotary position of new token `token` of request =
                         // value, not in [0, hi) (cos_sin_cache's rows); position 1: read from
                         // positions[request][token], 0: seq_lens[request] - q_len + token
};

struct CheckRecord {
  unsigned claimed;  // 0: clean; set once by atomicCAS, then the fields below are written
  unsigned kind;     // CheckKind
  int request;       // batch entry
  int token;         // query token (MLA indices), else 0
  int position;      // column of the index tensor (page slot, top-k slot), else 0
  int value;         // what was read
  long long hi;      // the bound it broke (see CheckKind); lo is implied by the kind
};

// Workspace bytes a checked plan reserves for the record: one allocation granule, so that the
// partial buffers before it keep their alignment.
inline constexpr unsigned long long kCheckBytes = 256;
static_assert(sizeof(CheckRecord) == 32, "the host reads 32 bytes");

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
// Called only on the rare bad path: the cost of the atomic does not matter.
__device__ __forceinline__ void check_report(CheckRecord* rec, unsigned kind, int request,
                                             int token, int position, int value, long long hi) {
  if (atomicCAS(&rec->claimed, 0u, 1u) != 0u) return;
  rec->kind = kind;
  rec->request = request;
  rec->token = token;
  rec->position = position;
  rec->value = value;
  rec->hi = hi;
}
#endif

}  // namespace deca
