// Compile-time shape of the Hopper GQA decode kernels (kernels/gqa/sm90/decode.cuh,
// docs/design-gqa-sm90.md): one warpgroup per CTA, the query rows of a KV head on wgmma's N (or M,
// decode_rows.cuh). fp8 caches take 128-token tiles; 16-bit caches (bf16 / fp16; DECA_GQA_SM90_16BIT=0
// sends them to the portable kernel) tiles of the same 16 KB per K or V (64 tokens at head_dim 128,
// 128 at 64, 32 at 256), so the ring, the stage rule and the CTAs per SM are the same for all
// (docs/perf-notes.md has the prediction behind that choice; head_dim 256 has a plan of its own
// for its wider q, make_kernel_plan). Host-compilable: the planner (src/cuda/gqa_spec.cpp) takes tile, threads and shared
// memory from the same `make_shape` as the device code, as it does for the portable kernel.
#pragma once

#include "kernels/common/kv_kind.cuh"
#include "kernels/gqa/sm80/traits.cuh"

namespace deca::gqa::sm90 {

constexpr int kTile = 128;      // fp8 tokens per stage: two m64 halves of the S^T wgmma
constexpr int kDim = 128;       // head_dim: one 128-byte swizzled row per fp8 token
constexpr int kWarpgroupThreads = 128;
constexpr int kStageBytes = kTile * kDim;  // one of K or V (fp8 128 tokens, 16-bit 64 tokens)

// What the fp8 kernel covers; other configurations take the portable kernel (or, 16-bit caches
// with the override, supports_16bit).
DECA_HD constexpr bool supports(int head_dim, int kv_dtype, int beam_width) {
  return head_dim == kDim && kv::kind_of(kv_dtype) == kv::kKvFp8 && beam_width == 1;
}
// The same kernels for a bf16 / fp16 cache: head_dim 64, 128 or 256, no beams.
DECA_HD constexpr bool supports_16bit(int head_dim, int kv_dtype, int beam_width) {
  return (head_dim == 64 || head_dim == kDim || head_dim == 256) && kv::kind_of(kv_dtype) == kv::kKv16 &&
         beam_width == 1;
}
// Bytes per cached value (1 fp8, 2 bf16 / fp16) and the tokens of a 16 KB tile of `head_dim`-wide
// rows of them: 128 (fp8 d128, 16-bit d64), 64 (16-bit d128) or 32 (16-bit d256).
DECA_HD constexpr int kv_bytes_of(int kv_dtype) { return kv::kind_of(kv_dtype) == kv::kKv16 ? 2 : 1; }
DECA_HD constexpr int tile_tokens(int kv_bytes, int head_dim = kDim) { return kStageBytes / (head_dim * kv_bytes); }

// Rows per CTA: the rows needed (q_len x group) rounded up to 8, 16, 32 or 64; more rows take
// more row blocks of 64. Up to 16 they are wgmma's N (decode.cuh), 32 and 64 its M
// (decode_rows.cuh, GqaKernelKey::rows_on_m): at 32 / 64 rows the rows-on-M kernel beat both the
// rows on N and the portable kernel (docs/perf-notes.md).
DECA_HD constexpr int rows_per_cta(int rows_needed) {
  return rows_needed <= 8 ? 8 : (rows_needed <= 16 ? 16 : (rows_needed <= 32 ? 32 : 64));
}

// Byte offsets from the 1024-aligned base. The stages first (each K then V, 128 token rows of 128
// B in the 128-byte swizzle; V is transposed in place into 128 d rows of 128 token bytes), then q
// and P as two e4m3 terms each (rows x 128 B, swizzled), the warps' column maxima and sums, and
// the inverse q scale per row. The epilogue's merge area (epilogue.cuh) reuses the stages.
// The rows-on-M kernel (decode_rows.cuh, `rows_on_m`) keeps P in registers and transposes V into
// a tile of its own (vt): no P tiles, no cross-warp maxima, q as 64 operand rows whatever the rows.
// 16-bit caches use the same offsets: a K or V stage is 64 tokens x 256 B as two column blocks
// of 64 rows x 128 B (d 0..63, then 64..127; layout.cuh tile16_offset), q is one 16-bit term of
// rows x 256 B whose two column blocks are the q_hi and q_lo areas, and P^T one term of rows x 64
// tokens x 2 B in the p_hi area (p_lo and q_inv unused).
struct SmemPlan {
  int stages;
  int q_hi, q_lo, p_hi, p_lo;
  int vt;     // rows on M: V^T, 128 d rows of 128 token bytes
  int red;    // float [warps][rows]
  int q_inv;  // float [operand rows]
  int end;
};

constexpr int kRowsOnMOperandRows = 64;  // wgmma's M

// q_row_bytes: 256 (fp8's two terms, 16-bit d64 / d128) or 512 (16-bit d256); `vt`: whether rows
// on M reserve the V^T tile (all but 16-bit d256, whose V is read as stored).
DECA_HD constexpr SmemPlan make_plan(int rows, int stages, bool rows_on_m = false, int q_row_bytes = 256,
                                     bool vt = true) {
  SmemPlan s{};
  s.stages = stages;
  const int q_rows = rows_on_m ? kRowsOnMOperandRows : rows;
  const int p_rows = rows_on_m ? 0 : rows;
  s.q_hi = stages * 2 * kStageBytes;
  s.q_lo = s.q_hi + q_rows * 128;
  s.p_hi = s.q_hi + q_rows * q_row_bytes;
  s.p_lo = s.p_hi + p_rows * 128;
  s.vt = s.p_lo + p_rows * 128;
  s.red = s.vt + (rows_on_m && vt ? kStageBytes : 0);
  s.q_inv = s.red + (rows_on_m ? 0 : 4 * rows * 4);
  s.end = s.q_inv + q_rows * 4;
  return s;
}

// Bytes of dynamic shared memory for a plan: its end plus the slack that aligns the base to 1024.
DECA_HD constexpr int smem_bytes(const SmemPlan& s) { return s.end + 1024; }

// The plan of a kernel: make_plan with the q row bytes and V^T tile of its head_dim and cache
// (kv_bytes_of): only 16-bit d256 differs from the fp8 plan.
DECA_HD constexpr bool wide_rows(int kv_bytes, int head_dim) { return head_dim * kv_bytes > 256; }
DECA_HD constexpr SmemPlan make_kernel_plan(int rows, int stages, bool rows_on_m, int kv_bytes, int head_dim) {
  return wide_rows(kv_bytes, head_dim) ? make_plan(rows, stages, rows_on_m, head_dim * kv_bytes, false)
                                       : make_plan(rows, stages, rows_on_m);
}

// As many stages as leave two CTAs per SM (227 KB with the 1 KB reserved per CTA), at least two.
DECA_HD constexpr int stages_for(int rows, bool rows_on_m = false, int kv_bytes = 1, int head_dim = kDim) {
  const int per_sm = 228 * 1024;
  int st = 4;
  while (st > 2 && 2 * (smem_bytes(make_kernel_plan(rows, st, rows_on_m, kv_bytes, head_dim)) + 1024) > per_sm) --st;
  return st;
}

// Stages for a launch of `units` CTAs before splitting (requests x kv heads x row blocks) on
// `sm_count` SMs. At 8 or 16 rows the kernel fits three CTAs per SM by registers; two stages let
// three fit by shared memory too, which pays when the grid fills three per SM (more warps to
// issue from), and costs when it does not (a third of the SMs' slots empty, each CTA with less in
// flight); docs/perf-notes.md has the H200 figures of both. 0: stages_for(rows).
// (`kv_bytes`, `head_dim`: the cache's, for the 16-bit d256 plan, where 16 rows at two stages
// fit only two CTAs: three stages then.)
DECA_HD constexpr int stages_for_grid(int rows, long long units, int sm_count, int kv_bytes = 1, int head_dim = kDim) {
  const bool three_fit = 3 * (smem_bytes(make_kernel_plan(rows, 2, false, kv_bytes, head_dim)) + 1024) <= 228 * 1024;
  return rows <= 16 && units >= 3LL * sm_count && three_fit ? 2 : 0;
}

// `stages` 0: stages_for(rows); else that many (stages_for_grid's 2 at 8 or 16 rows).
// `rows_on_m`: the rows-on-M kernel (decode_rows.cuh; 32 or 64 rows). `kv_bytes`: kv_bytes_of.
DECA_HD constexpr Shape make_shape(int rows, int stages = 0, bool rows_on_m = false, int kv_bytes = 1,
                                   int head_dim = kDim) {
  const SmemPlan plan = make_kernel_plan(rows, stages > 0 ? stages : stages_for(rows, rows_on_m, kv_bytes, head_dim),
                                        rows_on_m, kv_bytes, head_dim);
  Shape s{};
  s.threads = kWarpgroupThreads;
  s.warps_m = 1;
  s.warps_n = 1;  // one slice of keys per CTA: the warpgroup's accumulators hold every token
  s.tile = tile_tokens(kv_bytes, head_dim);
  s.warp_tokens = s.tile;
  s.chunk = s.tile;
  s.kv_bytes = kv_bytes;
  s.chunks_per_row = head_dim * kv_bytes / 16;
  s.row_stride = head_dim * kv_bytes;
  s.stage_bytes = kStageBytes;
  s.loads_per_thread = s.tile * s.chunks_per_row / s.threads;
  s.q_in_regs = false;
  s.q_row_stride = 128;
  s.q_bytes = (plan.p_hi - plan.q_hi);
  s.stages = plan.stages;
  s.pipe_bytes = 2 * plan.stages * kStageBytes;
  s.merge_bytes = rows * (head_dim + 2) * 4 + rows * 3 * 4;
  s.smem_bytes = smem_bytes(plan);
  const int fit = 228 * 1024 / (s.smem_bytes + 1024);
  // Rows on M: O, its per-tile partial and P's fragments take ~200 registers, two CTAs.
  s.min_ctas = fit >= 3 && !rows_on_m ? 3 : (fit >= 2 ? 2 : 1);
  return s;
}

// Beyond the shared constants (CfgConstants), the prologue of this kernel sets kStages (0: the
// default, stages_for) and kRowsOnM (GqaKernelKey::spec).
template <class Cfg>
struct Traits : CfgConstants<Cfg> {
  static constexpr bool kRowsOnM = Cfg::kRowsOnM;
  // A 16-bit cache (bf16 / fp16): one-term q and P of the cache's type on the 16-bit wgmma, V
  // read MN-major (no transpose), 64-token tiles. kF16: fp16 operands, else bf16.
  static constexpr bool k16 = kv::kind_of(Cfg::kKvDtype) == kv::kKv16;
  static constexpr bool kF16 = Cfg::kKvDtype == kv::kFP16;
  static constexpr int kKvBytes = kv_bytes_of(Cfg::kKvDtype);
  static constexpr Shape kShape = make_shape(Cfg::kRows, Cfg::kStages, kRowsOnM, kKvBytes, Cfg::kHeadDim);
  static constexpr int kTile = kShape.tile;
  static constexpr int kThreads = kShape.threads;
  static constexpr int kWarpsN = 1;
  // Output quads a thread merges at once (kernels/gqa/epilogue.cuh): two, sixteen loads in flight
  // (8 rows x 8 splits: one L2 trip instead of two). Below 125 registers at 8 / 16 rows.
  static constexpr int kMergeQuads = 2;
  static constexpr int kStages = kShape.stages;
  static constexpr int kSmemBytes = kShape.smem_bytes;
  static constexpr int kMinCtas = kShape.min_ctas;
  static constexpr SmemPlan kPlan = make_kernel_plan(Cfg::kRows, kStages, kRowsOnM, kKvBytes, Cfg::kHeadDim);
  static constexpr int kLoadsPerThread = kShape.loads_per_thread;
  static constexpr int kCols = Cfg::kRows / 4;  // query rows (accumulator columns) per thread

  static_assert(supports(Cfg::kHeadDim, Cfg::kKvDtype, Cfg::kBeamWidth) ||
                    supports_16bit(Cfg::kHeadDim, Cfg::kKvDtype, Cfg::kBeamWidth),
                "fp8 KV at head_dim 128, bf16 or fp16 at 64, 128 or 256, no beams");
  static_assert(kShape.loads_per_thread * kShape.threads == kTile * kShape.chunks_per_row, "loader");
  static_assert(kRowsOnM ? Cfg::kRows == 32 || Cfg::kRows == 64 : Cfg::kRows == 8 || Cfg::kRows == 16,
                "rows per CTA: 8 or 16 on wgmma's N (decode.cuh), 32 or 64 on its M (decode_rows.cuh)");
  static_assert(kStages >= 2, "pipeline");
  // Every wgmma operand starts on a swizzle atom (8 rows x 128 B): the descriptors' base offset is 0.
  static_assert(kPlan.q_hi % 1024 == 0 && kPlan.q_lo % 1024 == 0 && kPlan.p_hi % 1024 == 0 &&
                    kPlan.p_lo % 1024 == 0 && kPlan.vt % 1024 == 0 && (2 * kStageBytes) % 1024 == 0,
                "operands on 1024-byte atoms");
  // The merge area reuses the stages and, rows on M at head_dim 256 (64 x 256 f32), the q tile
  // after them: both are dead once the ring is drained.
  static_assert(kShape.merge_bytes <= kPlan.p_hi, "the merge area reuses the stages (and q)");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

}  // namespace deca::gqa::sm90
