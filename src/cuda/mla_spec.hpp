// MLA sparse decode kernel specializations: the small value type the JIT compiles, caches and
// names. One key per kernel of a run (scheduler, decode, combine) and the generic combine op.
#pragma once

#include <string>

#include "deca/mla.hpp"
#include "jit/spec.hpp"

namespace deca::cuda {

enum class MlaKernelRole { kSchedule, kDecode, kCombine, kGenericCombine };

// The sm90 warp-specialized decode kernel (kernels/mla/sm90/, written alongside this backend).
// Flip to true once kernels/mla/sm90/entry.cuh and traits.cuh are in the tree: every sm_90 plan
// then runs it unless DECA_MLA_KERNEL=portable.
inline constexpr bool kMlaSm90KernelEnabled = true;
// The sm90 kernel's producer variant a plan compiles unless the environment says otherwise
// (kernels/mla/sm90/traits.cuh: Cfg::kPipe, Cfg::kDequant; docs/perf-notes-mla.md the timings).
inline constexpr int kMlaSm90Pipe = 2;
inline constexpr int kMlaSm90Dequant = 0;
inline constexpr int kMlaSm90Sync = 1;      // Cfg::kSync: the cluster hand-overs' scope (1: light; 240 vs 258 us at b128 h128)
inline constexpr int kMlaSm90Prefetch = 0;  // Cfg::kPrefetch: lines, bulk record, none, sectors
inline constexpr int kMlaSm90Ahead = 2;     // Cfg::kAhead: blocks between prefetch and gather
inline constexpr int kMlaSm90Map = 0;       // Cfg::kMap: how the producer's threads split a block
inline constexpr int kMlaSm90L1 = 0;        // Cfg::kL1: the gather's L1 policy

struct MlaKernelKey {
  int arch = 90;                       // compute capability, 90 = sm_90a
  MlaKernelRole role = MlaKernelRole::kDecode;
  std::string variant = "portable";    // decode only: "portable" (sm_80+) or "sm90"
  int page_size = 0;                   // sm90 decode only: compiled in (Cfg::kPageSize)
  int cluster = 1;                     // sm90 decode only: CTAs sharing dequantized tokens (Cfg::kCluster)
  int pipe = 0;                        // sm90 decode only: producer pipelining (Cfg::kPipe, 0..3)
  int dequant = 0;                     // sm90 decode only: 1 = integer e4m3 placement (Cfg::kDequant)
  int sync = 0;                        // sm90 decode, cluster of 2: 1 = light hand-overs (Cfg::kSync)
  int prefetch = 0;                    // sm90 decode only: L2 prefetch route (Cfg::kPrefetch, 0..3)
  int ahead = 2;                       // sm90 decode, pipe >= 1: prefetch distance in blocks (Cfg::kAhead)
  int map = 0;                         // sm90 decode, pipe >= 1: 1 = a token per four lanes (Cfg::kMap)
  int l1 = 0;                          // sm90 decode only: 1 = gather loads L1::evict_last (Cfg::kL1)
  bool checked = false;                // portable decode only: MlaConfig::checked, "_chk"

  // e.g. "mla_sparse_decode_portable_sm90", "mla_sparse_combine_sm90", "combine_sm80"
  std::string name() const;
  // "// <name>" + #include of the role's entry header.
  jit::JitSpec spec() const;
};

// The decode variant a plan runs on a device of compute capability `arch`: "sm90" when the
// sm90 kernel is enabled, arch == 90 and DECA_MLA_KERNEL is not "portable"; else "portable".
std::string mla_decode_variant(int arch);

// Launch shape of a decode variant.
struct MlaDecodeShape {
  int threads = 0;
  int smem_bytes = 0;
  int cluster_x = 1;  // CTAs of a cluster along x (1: no cluster attribute)
};
MlaDecodeShape mla_decode_shape(const std::string& variant, int num_heads);

// The decode variant of a plan: a checked plan runs the portable kernel (the sm90 one has no
// checked variant yet), others mla_decode_variant(arch).
std::string mla_plan_variant(int arch, const MlaConfig& config);

// The decode key a plan of `config` runs with `variant` on compute capability `arch`: the sm90
// kernel compiles the page size in and, for 65..128 heads, may pair its two head blocks in a
// cluster (traits' kClusterX; DECA_MLA_CLUSTER=1|2 overrides it, a tuning knob in the name), and
// picks the producer's pipelining (DECA_MLA_PIPE=0..3) and dequantization route
// (DECA_MLA_DEQUANT=0|1, with pipe 3 only), the cluster hand-overs' scope (DECA_MLA_SYNC=0|1)
// the L2 prefetch route and distance (DECA_MLA_PREFETCH=0..3, DECA_MLA_AHEAD=1..8) and the
// producer's split of a block (DECA_MLA_MAP=0|1) and L1 policy (DECA_MLA_L1=0|1); defaults
// kMlaSm90Pipe, kMlaSm90Dequant, kMlaSm90Sync, kMlaSm90Prefetch, kMlaSm90Ahead, kMlaSm90Map,
// kMlaSm90L1.
MlaKernelKey mla_decode_key(int arch, const std::string& variant, const MlaConfig& config);

}  // namespace deca::cuda
