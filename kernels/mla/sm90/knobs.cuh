// The compile-time knobs of the sm90a MLA sparse decode kernel (decode.cuh): each a trait that
// reads Cfg::member when the NVRTC prologue defines it (src/cuda/mla_spec.cpp renders every one)
// and falls back to the default otherwise, with what each value does and what it measured.
#pragma once

#include "kernels/mla/sm90/traits.cuh"

namespace deca::mla::sm90 {

using namespace ::deca::sm90;  // the Hopper PTX wrappers

// Cfg knobs: Cfg::member when the prologue defines it, else the fallback.
#define DECA_MLA_SM90_KNOB(Trait, member, fallback)           \
  template <class C, class = void>                            \
  struct Trait {                                              \
    static constexpr int value = fallback;                    \
  };                                                          \
  template <class C>                                          \
  struct Trait<C, decltype(void(C::member))> {                \
    static constexpr int value = C::member;                   \
  };

// CTAs per cluster (traits.cuh kClusterX).
DECA_MLA_SM90_KNOB(ClusterOf, kCluster, 1)

// Variants that leave one stage out, for timing only (their numbers are wrong): what the kernel
// costs without the e4m3 -> bf16 conversion (the raw bytes are stored instead), without the
// tensor cores, without the gather's memory traffic (each record load returns finite bytes made
// from its address, the L2 prefetch is left out; ids, Q and the outputs still go to memory), or
// without both of the last two (the pipeline's skeleton: hand-overs, conversion, softmax), and in
// a cluster of 2 without the dequantized NoPE sent to the peer (only the RoPE units cross), with
// and without the rest of the skeleton's ablations. The last three take one side away to time
// the other alone: consumers only (the producers gather nothing, the consumers never wait for a
// tile and compute on zeroed tiles and ids), producers only (the consumers release every tile
// as soon as it is full, and write nothing), and producers only without the gather's memory.
enum Ablate : int {
  kAblateNone = 0,
  kAblateNoDequant = 1,
  kAblateNoMma = 2,
  kAblateNoGather = 3,
  kAblateNoGatherNoMma = 4,
  kAblateNoPeer = 5,
  kAblateSkeletonNoPeer = 6,
  kAblateConsumersOnly = 7,
  kAblateProducersOnly = 8,
  kAblateProducersOnlyNoGather = 9
};
DECA_MLA_SM90_KNOB(AblateOf, kAblate, kAblateNone)
template <class Cfg>
inline constexpr bool kNoMma = AblateOf<Cfg>::value == kAblateNoMma ||
                               AblateOf<Cfg>::value == kAblateNoGatherNoMma ||
                               AblateOf<Cfg>::value == kAblateSkeletonNoPeer;
template <class Cfg>
inline constexpr bool kNoGather = AblateOf<Cfg>::value == kAblateNoGather ||
                                  AblateOf<Cfg>::value == kAblateNoGatherNoMma ||
                                  AblateOf<Cfg>::value == kAblateSkeletonNoPeer ||
                                  AblateOf<Cfg>::value == kAblateProducersOnlyNoGather;
template <class Cfg>
inline constexpr bool kNoProduce = AblateOf<Cfg>::value == kAblateConsumersOnly;
template <class Cfg>
inline constexpr bool kNoConsume = AblateOf<Cfg>::value == kAblateProducersOnly ||
                                   AblateOf<Cfg>::value == kAblateProducersOnlyNoGather;
template <class Cfg>
inline constexpr bool kNoPeer =
    AblateOf<Cfg>::value == kAblateNoPeer || AblateOf<Cfg>::value == kAblateSkeletonNoPeer;

// How the producer orders its global loads against the tile handshake (traits.cuh Pipe; see
// producer_ahead).
DECA_MLA_SM90_KNOB(PipeOf, kPipe, kPipeBase)

// 0 the hardware conversions (dequant4), 1 the integer placement (dequant4_int) for every scale
// below 2^8, dequant4 for the others, 2 the f16 -> f32 step on the tensor cores (dequant16_mma).
DECA_MLA_SM90_KNOB(DequantOf, kDequant, 0)

// The cluster's tile hand-overs (cluster of 2 only). 0: release / acquire at cluster scope;
// every consumer warp's arrival on the peer's empty barrier then costs a MEMBAR.ALL.GPU and
// every cluster-scope wait a CCTL.IVALL (L1 invalidation), ~12 % of the warp-state samples at
// b128 h128 (ncu, 2026-12-01). 1: the remote arrival relaxed (the tile's reads completed at
// wgmma.wait_group, before it issues), the waits at CTA scope (the peer's st.async bytes are
// made visible by the barrier's transaction count, not by the wait's scope).
enum ClusterSync : int { kSyncCluster = 0, kSyncLight = 1 };
DECA_MLA_SM90_KNOB(SyncOf, kSync, kSyncCluster)

// The L2 prefetch of the records kAhead blocks ahead. 0: prefetch.global.L2 at every 128 bytes
// of a record (seven, shared by the token's threads); 1: one cp.async.bulk.prefetch.L2 of the
// whole 656-byte record per token; 2: none (the loads' L2::256B hint alone); 3: prefetch.global.L2
// at every 32 bytes (22 per record), in case a prefetch fetches one sector rather than a line.
// Measured at b128 h64 (c811419, whole op): lines 166 us, bulk 182, none 183.
enum Prefetch : int { kPrefetchLines = 0, kPrefetchBulk = 1, kPrefetchNone = 2, kPrefetchSectors = 3 };
DECA_MLA_SM90_KNOB(PrefetchOf, kPrefetch, kPrefetchLines)
// How many blocks ahead of the one it gathers the producer prefetches (pipe >= kPipeAhead).
DECA_MLA_SM90_KNOB(AheadOf, kAhead, 2)

// How the producer's threads split a block's records. 0: thread t takes 16-byte unit t % 32 of
// every fourth token (16 tokens per thread without a cluster: a record address, a scale load and
// two swizzled store addresses per token and unit); 1: four lanes take one token (lane % 8 picks
// the token of the warp's eight, lane / 8 a quarter of each 64-byte group), eight 16-byte units
// of it each (one address and one 16-byte scale load per token, store addresses one XOR apart):
// ncu at b128 h64 counted ~1600 producer instructions per block and thread with map 0, 48 %
// of them the conversion, most of the rest the per-token addressing. Map 1 executes 29 % fewer
// and is still slower (172 vs 165 us at b128 h64, 7409a3c): its loads wait longer (eight
// records' 64-byte pieces per warp load) and its stores crowd the MIO queue of consumer 0.
// 2: the unit split, with the two lanes of a pair (j, j ^ 1: units U, U + 1 and U + 2, U + 3 of
// one chunk row) swapping raw halves first, so that each of the two 16-byte stores of the pair
// completes a 32-byte sector (units U and U + 1, then U + 2 and U + 3; the swizzle keeps such
// pairs together). The unit split's stores leave every sector half written per instruction; for
// the peer's tile (st.async, a cluster of 2) the tuning guide asks for 32-byte segments, as for
// global memory.
// 3: lane l of the warp on token n takes the 8-byte NoPE pieces of units l % 8 of chunks cA and
// cA + 2, cA = o % 2 + 4 (o / 2) for its octet o = l / 8 (two 8-byte loads, and one of the two
// 128-value groups' scales, which both chunks share), so that each of its two stores is one
// eighth of a whole 128-byte row of the tile: a warp's store writes four rows, each a contiguous
// 128 bytes (the swizzle permutes units within a row), for the peer's st.async as well.
enum Map : int { kMapUnits = 0, kMapTokens = 1, kMapPairs = 2, kMapRows = 3 };
DECA_MLA_SM90_KNOB(MapOf, kMap, kMapUnits)

// The gather's L1 policy: 0 L1::no_allocate (each CTA reads a token once), 1 L1::evict_last
// (FlashMLA's). With the unit split no faster (d676a5a); with the whole-row pieces, whose lanes
// read each record line (and its scales) in several instructions, 2.5 % faster without a
// cluster and even in one (159427c): the plan's default without a cluster.
DECA_MLA_SM90_KNOB(L1Of, kL1, 0)

// When the consumers rescale O (128 FMUL per thread and block in each). 0: every block;
// 1: a warp skips it when every factor of its 16 rows is 1 (the running maxima unchanged: the
// same bytes as 0); 2: also keeps a row's running maximum until a block's exceeds it by more
// than 8 (log2 units), so P <= 2^8 and the rescale is rare after the first blocks (the sums and
// O carry the same reference, so the output is the same up to f32 rounding).
enum Rescale : int { kRescaleEvery = 0, kRescaleSkipOnes = 1, kRescaleLazy = 2 };
DECA_MLA_SM90_KNOB(RescaleOf, kRescale, kRescaleEvery)

// How consumer 1 takes P. 0: its P V reads P from shared memory through the async proxy, so
// consumer 0 fences (fence.proxy.async: MEMBAR + FENCE.VIEW.ASYNC, ~4 % of its samples at b128
// h128) before handing it over; 1: consumer 1 loads its A fragments with ld.shared (the same
// addresses consumer 0 stored them to, the fragment layouts being the same) and runs P V from
// registers; the hand-over is then an mbarrier release / acquire, and P's slot is free as soon as
// the loads complete. With one producer warpgroup it cost consumer 0 16 registers and was slower
// (b128 h128 225.2 -> 230.1 us); with two in a cluster, whose producers fit in 56 registers,
// consumer 0 keeps 224 and it is the cluster's default (181.6 -> 174.5 us, 2026-12-02).
// 2: as 0, but consumer 0 issues its own P V (A from registers) before the hand-over, which then
// runs while that P V executes.
// 3: as 0, with consumer 0's own P V reading P from shared memory too, and the next block's
// S = Q K^T issued right behind it when that tile is already full, so that the tensor cores run
// P V and the next QK^T back to back while consumer 0 waits for P V alone (O 128 and S 32 in
// flight at once: with P's 16 A registers too, ptxas serializes every wgmma, C7511). Measured
// slower (42d7715, H200: b128 h128 222.7 -> 228.1 us, b128 h64 124.2 -> 128.1): the producers,
// not consumer 0's chain, bound the block (docs/perf-notes-mla.md, 2026-12-02).
enum PHand : int { kPHandSmem = 0, kPHandRegs = 1, kPHandAfterPv = 2, kPHandOverlap = 3 };
DECA_MLA_SM90_KNOB(PHandOf, kPHand, kPHandSmem)

// Producer warpgroups (1 or 2; 2 with kPipe 1..4 and the unit split). One producer warpgroup is
// one warp per SM sub-partition for the whole gather and conversion: ncu at b128 h64 had it
// issuing in 19 % of its samples, the rest its own latencies (loads, fixed-latency dependencies,
// dispatch) that no other warp of the sub-partition covers. Two warpgroups split the block's
// tokens between them (512 threads, 128 registers each at launch; traits.cuh reg_budget gives
// consumer 0 200, consumer 1 160 and each producer 72): two warps per sub-partition, each with
// half the work. Measured -3 to -4 % without a cluster, +4 % in one (docs/perf-notes-mla.md):
// the producers then wait on their loads rather than on issue.
DECA_MLA_SM90_KNOB(ProducersOf, kProducers, 1)

// How a producer in a cluster of 2 writes its tokens into the peer's tile. 0: every thread
// st.async's each 16-byte unit it stores locally (the peer's barrier counts the bytes); 1: the
// threads store locally only, and once a warpgroup's rows are all stored (fence.proxy.async, a
// named barrier) one thread hands them to the bulk-copy unit, one copy per 128-byte-column
// chunk (kTokens / kWays rows of 128 bytes, contiguous in each chunk), completing on the same
// barrier with the same bytes. Without a cluster nothing crosses: no effect.
DECA_MLA_SM90_KNOB(PeerCopyOf, kPeerCopy, 0)
template <class Cfg>
inline constexpr bool kBulkPeer = ClusterOf<Cfg>::value == 2 && PeerCopyOf<Cfg>::value == 1;

// How the two consumer warpgroups share a block. 0: consumer 0 runs every block's S = Q K^T and
// softmax and hands P to consumer 1 (kPHand says how); each runs P V on its half of O's columns.
// While consumer 0 runs the softmax and the hand-over the tensor cores idle and consumer 1 waits
// (stamps at b128 h128, cluster: QK^T ~1580, softmax ~920, hand-over ~360, P V ~850 clk of
// consumer 0 per block; consumer 1 waits ~3100). 1: "seesaw" (seesaw.cuh, after FlashMLA's
// dense decode): the consumers take alternate blocks, each running that block's S and softmax
// and publishing P and the new row maxima for the other, so that one's QK^T runs under the
// other's softmax; the running maxima pass from one to the other block by block. Each holds S,
// its own P and its half of O (200 registers): two producer warpgroups in a cluster (56 each).
// 1 issues a warpgroup's S before it takes the other's block (S under the other's softmax when
// the tile is already full); 2 takes the other's block first (its P V and its tile's release do
// not wait for this block's tile). Measured (H200, kernel alone, b128 h128, df91fa5): 1 214.8 us,
// 2 194.9, against 168.9 for the default (consumers alone 131.9 / 133.4 / 134.1): with two K
// tiles the ring, not the tensor cores, paces the block (docs/perf-notes-mla.md, 2026-12-02,
// sixth part). Off.
DECA_MLA_SM90_KNOB(SeesawOf, kSeesaw, 0)

// 1: at most 16 heads (no cluster), the heads on N = 16 in both consumers (narrow.cuh): consumer
// 0 computes S^T = K Q^T with the tokens on M (36 wgmma m64n16k16: each reads 2.5 KB of shared
// memory against 4 KB for m64n64k16, and a quarter of the tensor work) instead of S = Q K^T with
// 64 padded heads on M; the softmax runs down the columns (per head over the 64 tokens: the four
// warps exchange their maxima through shared memory) and P is stored transposed (stmatrix
// .trans); both consumers then compute O^T = V^T P^T for their 256 columns (16 m64n16k16 each,
// 32 accumulators instead of 128). At 16 heads the consumers alone took as long as at 64 (the
// padded QK^T), above what 2500 GB/s allows (docs/perf-notes-mla.md, 2026-12-02, eighth part).
DECA_MLA_SM90_KNOB(NarrowOf, kNarrow, 0)
template <class Cfg>
inline constexpr bool kNarrowS = NarrowOf<Cfg>::value == 1;

// 1: at most 16 heads (num_heads <= 16, no cluster, two producers' whole shares in rows: the plan
// of 16 heads), the records of the block after the one converted are staged whole in shared
// memory by the bulk-copy unit (one cp.async.bulk of 656 bytes per token, completing on an
// mbarrier of the converting warp and half of its tokens) in the Q tile's rows 16..63, which
// 16 heads leave unused: the producers then read their pieces with ld.shared from addresses
// fixed per lane, and the gather's memory latency runs under a block's conversion without
// registers held for it (two producers' 72 registers hold one whole share's loads, so pipe 2
// waits for a full L2 latency per block: the producers alone took 83.5 us at b128 h64 against
// 65.5 without the gather's memory, 3137a0b). The Q tile then holds 16 real rows (load_q
// writes no others) and the outputs leave by direct stores (store_o).
DECA_MLA_SM90_KNOB(StageOf, kStage, 0)
template <class Cfg>
inline constexpr bool kStaged = StageOf<Cfg>::value == 1;

// 1..3: at most 16 heads (one head block, no cluster, one producer warpgroup's 384 threads), no bf16
// tile at all (direct.cuh, which says what each value changes): the records land in a ring of
// four slots and the consumers multiply them from registers as they are: S^T = K Q^T on the f16
// tensor cores (the e4m3 words widened in registers, Q as f16; the per-128 scales applied per
// token after the products), O^T = V^T P^T on the e4m3 tensor cores (V transposed by byte
// permutes, P as two e4m3 terms with the scales folded in). 3 is the plan's at 16 heads or fewer
// (H200, b128 h16 whole op: 59.9 us against 77.1 for the staged records with the heads on N).
// Every other producer and consumer knob is then without effect.
DECA_MLA_SM90_KNOB(DirectOf, kDirect, 0)
template <class Cfg>
inline constexpr bool kDirect = DirectOf<Cfg>::value >= 1;

// 1: every role adds up the cycles of each phase of a block and the first CTAs print the means;
// 2: every CTA records when it passes the launch's events (entry, first tile, last release,
// outputs stored, exit) and the backend prints their spread (stamps.cuh; timing aids, never a
// plan's).
DECA_MLA_SM90_KNOB(StampOf, kStamp, 0)
template <class Cfg>
inline constexpr bool kStamped = StampOf<Cfg>::value == 1;

#undef DECA_MLA_SM90_KNOB

}  // namespace deca::mla::sm90
