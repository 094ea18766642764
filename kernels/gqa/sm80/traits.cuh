// Compile-time shape of the portable GQA decode kernel. `make_shape` is a constexpr function so
// that the device code (through Traits<Cfg>) and the host planner (src/plan/, at run time) derive
// tile sizes and shared-memory bytes from the same lines; nothing is kept twice by hand.
#pragma once

#include "kernels/common/cfg_field.cuh"
#include "kernels/common/kv_kind.cuh"
#include "kernels/gqa/stamps.cuh"

namespace deca::gqa {

struct Shape {
  int threads;
  int warps_m;         // warps side by side along rows (16 rows each)
  int warps_n;         // warps side by side along the tokens of a tile
  int tile;            // tokens per pipeline stage
  int warp_tokens;     // tokens per warp per stage
  int chunk;           // tokens per online-softmax step
  int kv_bytes;        // bytes per cached value
  int chunks_per_row;  // 16-byte chunks per token row
  int row_stride;      // bytes per token row in shared memory
  int stage_bytes;     // one of K or V, one stage
  int loads_per_thread;
  bool q_in_regs;
  int q_row_stride;
  int q_bytes;
  int stages;
  int pipe_bytes;
  int merge_bytes;
  int smem_bytes;      // dynamic shared memory per CTA
  int min_ctas;        // CTAs per SM the shared memory is sized for: the register budget follows
};

// Rows (query token x group head) per CTA for `rows_needed` = q_len * group: 16, 32 or 64.
DECA_HD constexpr int rows_per_cta(int rows_needed) {
  return rows_needed <= 16 ? 16 : (rows_needed <= 32 ? 32 : 64);
}

// Built for 2 CTAs per SM: Q in registers up to head_dim 128, three stages where two CTAs fit.
DECA_HD constexpr Shape make_shape(int head_dim, int rows, int kv_dtype) {
  Shape s{};
  s.threads = 128;
  s.warps_m = rows / 16;
  s.warps_n = 4 / s.warps_m;
  s.kv_bytes = kv::kind_of(kv_dtype) == kv::kKv16 ? 2 : 1;
  // About 32 KB of K+V per stage whatever the dtype, so an fp8 stage holds twice the tokens of a
  // bf16 one and keeps as many bytes in flight; a power of two between 16 tokens per
  // warp column and 128 so that warps and softmax chunks divide it.
  const int row_bytes = head_dim * s.kv_bytes;
  const int raw = 32768 / (2 * row_bytes);
  const int pow2 = raw >= 128 ? 128 : raw >= 64 ? 64 : raw >= 32 ? 32 : 16;
  const int min_tile = 16 * s.warps_n;
  s.tile = pow2 < min_tile ? min_tile : pow2;
  s.warp_tokens = s.tile / s.warps_n;
  s.chunk = s.warp_tokens < 32 ? s.warp_tokens : 32;
  // Rows padded to an odd number of 16-byte chunks: ldmatrix (8 rows x 16 B) then hits 32
  // distinct banks.
  s.chunks_per_row = row_bytes / 16;
  s.row_stride = ((s.chunks_per_row & 1) ? s.chunks_per_row : s.chunks_per_row + 1) * 16;
  s.stage_bytes = s.tile * s.row_stride;
  s.loads_per_thread = (s.tile * s.chunks_per_row + s.threads - 1) / s.threads;
  // Q stays in registers up to head_dim 128; beyond, it is read from shared memory per use so
  // that the output accumulators (head_dim / 2 registers) do not spill.
  s.q_in_regs = head_dim <= 128;
  s.q_row_stride = (head_dim * 2 / 16 + 1) * 16;
  s.q_bytes = s.q_in_regs ? 0 : rows * s.q_row_stride;
  // Three stages when two CTAs still fit on an SM (227 KB), else as many as fit in one (>= 2).
  const int smem_per_sm = 227 * 1024;
  const int for2 = (smem_per_sm / 2 - s.q_bytes) / (2 * s.stage_bytes);
  const int for1 = (smem_per_sm - s.q_bytes) / (2 * s.stage_bytes);
  s.stages = for2 >= 3 ? 3 : (for1 >= 3 ? 3 : 2);
  s.pipe_bytes = 2 * s.stages * s.stage_bytes;
  // The warps' partial rows, then per row: max, sum and a weight per warp.
  s.merge_bytes = s.warps_n * rows * (head_dim + 2) * 4 + rows * (2 + s.warps_n) * 4;
  s.smem_bytes = (s.pipe_bytes > s.merge_bytes ? s.pipe_bytes : s.merge_bytes) + s.q_bytes;
  const int fit = smem_per_sm / (s.smem_bytes + 1024);
  s.min_ctas = fit < 2 ? (fit < 1 ? 1 : fit) : 2;
  return s;
}

// Most splits the last CTA can merge: it stages (max, sum) of every split of its rows in shared
// memory.
DECA_HD constexpr int max_merge_splits(const Shape& s, int rows) { return s.smem_bytes / (rows * 8); }

// Optional Cfg members (kernels/common/cfg_field.cuh): checked mode, skip-softmax and the fused
// step's RoPE style and rotated dims are defined only by their kernels' prologues.
DECA_CFG_FIELD(CheckedOf, kChecked, false)
DECA_CFG_FIELD(SkipOf, kSkip, false)
DECA_CFG_FIELD(RopeStyleOf, kRopeStyle, 0)
DECA_CFG_FIELD(RotaryDimOf, kRotaryDim, 0)

// The specialization constants both GQA kernels read (this file's Traits and sm90/traits.cuh's),
// as a base so that T::kGroup and the like name the same lines; code inside a Traits reads
// them as Cfg:: (members of a dependent base are not found unqualified).
template <class Cfg>
struct CfgConstants {
  static constexpr int kHeadDim = Cfg::kHeadDim;
  static constexpr int kGroup = Cfg::kGroup;
  static constexpr int kRows = Cfg::kRows;
  static constexpr int kPageSize = Cfg::kPageSize;
  static constexpr int kQDtype = Cfg::kQDtype;
  static constexpr int kKvDtype = Cfg::kKvDtype;
  static constexpr int kOutDtype = Cfg::kOutDtype;
  static constexpr bool kWindow = Cfg::kWindow;
  static constexpr bool kTree = Cfg::kTree;
  static constexpr bool kSoftcap = Cfg::kSoftcap;
  static constexpr int kBeamWidth = Cfg::kBeamWidth;  // beams per request sharing one CTA (1: none)
  // Checked mode: page ids and lengths tested as read, bad ones masked and recorded.
  static constexpr bool kChecked = CheckedOf<Cfg>::value;
  // Skip-softmax: tiles far below the running maximum skipped, their V not loaded.
  static constexpr bool kSkip = SkipOf<Cfg>::value;
  // Fused decode step (kernels/gqa/fused.cuh): 0 = a plain decode, 1 GPT-NeoX, 2 GPT-J.
  static constexpr int kRopeStyle = RopeStyleOf<Cfg>::value;
  static constexpr int kRotaryDim = RotaryDimOf<Cfg>::value;
  static constexpr bool kFused = kRopeStyle != 0;
  // The phase stamps' build (kernels/gqa/stamps.cuh, GqaKernelKey::stamps): a timing aid, only the
  // Hopper kernels mark their phases.
  static constexpr bool kStamps = kStampBuild;
};

template <class Cfg>
struct Traits : CfgConstants<Cfg> {
  static constexpr int kKvKind = kv::kind_of(Cfg::kKvDtype);
  static constexpr bool kComputeFp16 = kv::compute_fp16(Cfg::kQDtype, Cfg::kKvDtype);
  // 8-bit caches scale q per row into fp16 range (kernels/common/kv_kind.cuh), or into e4m3
  // (int8) range for the two-term path.
  static constexpr bool kScaleQRows = kKvKind != kv::kKv16;
  // An 8-bit cache's path (kv_kind.cuh Fp8Mma, GqaKernelKey::fp8_path). kTwoTerm: q as two terms
  // of the cache's type and QK on the 8-bit mma: e4m3 for fp8 (kv::kTwoTerm, sm_89+), IMMA for
  // int8 (kv::kTwoTermQk, kTwoTermI8). kPvTwoTerm: P as two e4m3 terms and PV on the e4m3 mma
  // too (fp8 kv::kTwoTerm). kLdsm8: the cache widened to fp16 from ldmatrix loads for every
  // product the two-term path does not take (kv::kWidenLdsm; int8 kv::kTwoTermQk's PV).
  static constexpr bool kPvTwoTerm = kKvKind == kv::kKvFp8 && Cfg::kFp8Mma == kv::kTwoTerm;
  static constexpr bool kTwoTermI8 = kKvKind == kv::kKvInt8 && Cfg::kFp8Mma == kv::kTwoTermQk;
  static constexpr bool kTwoTerm = kPvTwoTerm || kTwoTermI8;
  static constexpr bool kLdsm8 = kKvKind != kv::kKv16 && !kPvTwoTerm;
  // Every 8-bit V path puts a 16-dim block's even dims in one n8 tile, odd in the next.
  static constexpr bool kVPairs16 = kKvKind != kv::kKv16;

  static constexpr Shape kShape = make_shape(Cfg::kHeadDim, Cfg::kRows, Cfg::kKvDtype);
  static constexpr int kThreads = kShape.threads;
  static constexpr int kWarpsN = kShape.warps_n;
  // Output quads a thread merges at once (kernels/gqa/epilogue.cuh): one. The two-term and beam
  // kernels sit at 255 registers, where a second quad's eight loads in flight spill.
  static constexpr int kMergeQuads = 1;
  static constexpr int kKvBytes = kShape.kv_bytes;
  static constexpr int kTile = kShape.tile;
  static constexpr int kWarpTokens = kShape.warp_tokens;
  static constexpr int kChunk = kShape.chunk;
  static constexpr int kChunksPerRow = kShape.chunks_per_row;
  static constexpr int kRowStride = kShape.row_stride;
  static constexpr int kStageBytes = kShape.stage_bytes;
  static constexpr int kLoadsPerThread = kShape.loads_per_thread;
  static constexpr bool kQInRegs = kShape.q_in_regs;
  static constexpr int kQRowStride = kShape.q_row_stride;
  static constexpr int kStages = kShape.stages;
  static constexpr int kPipeBytes = kShape.pipe_bytes;
  static constexpr int kMergeBytes = kShape.merge_bytes;
  static constexpr int kSmemBytes = kShape.smem_bytes;
  static constexpr int kMinCtas = kShape.min_ctas;
  // Checked mode: slots of the per-item bad-page flags (cta.cuh checked_items): an item's page ids
  // are read kStages iterations before the item is consumed, kStages + 1 with skip-softmax (its K
  // runs a tile further ahead, skip.cuh).
  static constexpr int kBadItemSlots = kStages + (CfgConstants<Cfg>::kSkip ? 2 : 1);

  // The two-term path's k steps: 32 dims (QK) or 32 tokens (PV) per m16n8k32; a last QK step of
  // 16 dims when head_dim % 32 == 16, and 16-token PV steps when a warp's chunk is 16 tokens.
  static constexpr int kK32Steps = (Cfg::kHeadDim + 31) / 32;

  static_assert(Cfg::kHeadDim % 16 == 0 && Cfg::kHeadDim >= 16 && Cfg::kHeadDim <= 256, "head_dim");
  static_assert(Cfg::kRows == 16 || Cfg::kRows == 32 || Cfg::kRows == 64, "rows per CTA");
  static_assert(kTile % (16 * kWarpsN) == 0, "each warp takes whole 16-token steps");
  static_assert(kWarpTokens % kChunk == 0 && kChunk % 16 == 0, "chunking");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
  static_assert(Cfg::kGroup >= 1, "group");
  static_assert(kKvKind == kv::kKv16 ||
                    (kKvKind == kv::kKvFp8 ? Cfg::kFp8Mma == kv::kTwoTerm || Cfg::kFp8Mma == kv::kWidenLdsm
                                           : Cfg::kFp8Mma == kv::kTwoTermQk || Cfg::kFp8Mma == kv::kWidenLdsm),
                "8-bit path: fp8 two_term | widen_ldsm, int8 two_term_qk | widen_ldsm");
};

}  // namespace deca::gqa
