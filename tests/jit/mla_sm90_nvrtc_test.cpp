// NVRTC compiles the sm90a MLA sparse FP8 decode kernel (no GPU needed: runs in CI) for page sizes
// 1, 64 and 128 (the page size only changes a division) and both cluster sizes; each cubin exports the entry, and ptxas reports no spills, no stack and
// none of the warnings that silently cost the design its point: setmaxnreg ignored (C7508) or
// wgmma serialized (the accumulators touched inside a wgmma pipeline stage).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "jit/elf_symbols.hpp"
#include "jit/mla_sm90_spec.hpp"
#include "jit/nvrtc_compile.hpp"
#include "kernels/mla/sm90/traits.cuh"

namespace deca {
namespace {

// `timing_only`: an ablation whose numbers are wrong anyway; a few spilled bytes there only
// blur its time, so they are printed, not failed on.
// `spill_bytes`: the spill stores (and loads) this variant is known to have, exactly (so that any
// growth fails); 0 for every variant but those a comment names.
void expect_clean_compile(const jit::JitSpec& spec, bool timing_only = false, int spill_bytes = 0) {
  const jit::CompileResult r = jit::compile(spec);
  ASSERT_FALSE(r.cubin.empty()) << spec.name;
  ASSERT_TRUE(r.ptxas.found) << spec.name << ": no ptxas report in the NVRTC log:\n" << r.log;
  EXPECT_TRUE(jit::testing::elf_has_symbol(r.cubin, spec.entry)) << spec.name;
  std::printf("[nvrtc] %-32s %7.0f ms  regs=%d spill_stores=%d spill_loads=%d stack=%d\n",
              spec.name.c_str(), r.compile_ms, r.ptxas.registers, r.ptxas.spill_store_bytes,
              r.ptxas.spill_load_bytes, r.ptxas.stack_bytes);
  if (!timing_only) {
    EXPECT_EQ(r.ptxas.spill_store_bytes, spill_bytes) << spec.name;
    EXPECT_EQ(r.ptxas.spill_load_bytes, spill_bytes) << spec.name;
    EXPECT_LE(r.ptxas.stack_bytes, spill_bytes == 0 ? 0 : 2 * spill_bytes) << spec.name;
  }
  // 384 threads (512 with two producers), one CTA per SM: the launch budget setmaxnreg
  // redistributes.
  const bool two = spec.source.find("kProducers = 2;") != std::string::npos;
  EXPECT_LE(r.ptxas.registers, two ? 128 : 168) << spec.name;
  EXPECT_EQ(r.log.find("C7508"), std::string::npos) << spec.name << ":\n" << r.log;
  EXPECT_EQ(r.log.find("serialized"), std::string::npos) << spec.name << ":\n" << r.log;
}

TEST(MlaSm90Nvrtc, CompilesWithoutSpillsForPageSizes) {
  for (int page : {1, 64, 128}) expect_clean_compile(test::mla_sm90_spec(page));
}

// The 2-CTA cluster variant (128 heads: the two head blocks share the dequantized tokens).
TEST(MlaSm90Nvrtc, ClusterVariantCompilesWithoutSpills) {
  for (int page : {1, 64}) expect_clean_compile(test::mla_sm90_spec(page, 2));
}

// The timing variants that leave the dequantization, the tensor cores, the gather's memory
// traffic, both of the last two, or (in a cluster) the NoPE sent to the peer out; the last three also with the plan's defaults of both
// cluster sizes, as the timing test runs them.
TEST(MlaSm90Nvrtc, AblationVariantsCompileWithoutSpills) {
  for (int ablate : {1, 2, 3, 4}) expect_clean_compile(test::mla_sm90_spec(64, 1, ablate));
  for (int ablate : {3, 4}) {
    expect_clean_compile(test::mla_sm90_spec(64, 1, ablate, 1, 0, 0, 0, 1, 0, 0, 2, 2, 2), true);
    expect_clean_compile(test::mla_sm90_spec(64, 1, ablate, 1, 0, 0, 0, 1, 3, 0, 2, 2, 2), true);
    expect_clean_compile(test::mla_sm90_spec(64, 1, ablate - 2, 1, 0, 0, 0, 1, 3, 0, 2, 2, 2), true);
    expect_clean_compile(test::mla_sm90_spec(64, 2, ablate, 2, 0, 1, 0, 1, 0, 0, 2, 0, 1), true);
  }
  // Without the NoPE crossing to the peer (cluster only).
  for (int ablate : {5, 6}) expect_clean_compile(test::mla_sm90_spec(64, 2, ablate, 2, 0, 1, 0, 1, 0, 0, 2, 0, 1), true);
}

// The producer pipeline variants (Cfg::kPipe 1..3), both cluster sizes: each must keep the
// rebalanced register budgets without spills and without serialized wgmma.
TEST(MlaSm90Nvrtc, PipeVariantsCompileWithoutSpills) {
  for (int pipe : {1, 2, 3, 4}) {
    for (int cluster : {1, 2}) expect_clean_compile(test::mla_sm90_spec(64, cluster, 0, pipe));
  }
  expect_clean_compile(test::mla_sm90_spec(1, 1, 0, 3));
  // The f16 -> f32 step on the tensor cores (Cfg::kDequant = 2) with pipes 2 to 4, in a cluster.
  for (int pipe : {2, 3, 4}) expect_clean_compile(test::mla_sm90_spec(64, 2, 0, pipe, 2, 1));
  expect_clean_compile(test::mla_sm90_spec(1, 2, 0, 4, 2, 1));
  // The round stream with the light cluster hand-overs (the default pairing), page size 1.
  expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 4, 0, 1));
  expect_clean_compile(test::mla_sm90_spec(1, 2, 0, 4, 0, 1));
  expect_clean_compile(test::mla_sm90_spec(1, 1, 0, 4));
  // The integer e4m3 placement (Cfg::kDequant = 1) with pipe 3 (at the 112 producer registers of
  // pipes 0-1 it spills 24 B without a cluster: not offered there).
  for (int cluster : {1, 2}) expect_clean_compile(test::mla_sm90_spec(64, cluster, 0, 3, 1));
  // The ablations of pipe 3 that the timing test runs (timing only: a few spilled bytes there,
  // as at 128 producer registers, would only blur their time).
  for (int ablate : {1, 2}) {
    for (int cluster : {1, 2}) {
      expect_clean_compile(test::mla_sm90_spec(64, cluster, ablate, 3), true);
      expect_clean_compile(test::mla_sm90_spec(64, cluster, ablate, 4, 0, cluster - 1), true);
    }
  }
}

// The cluster hand-overs at light scope (Cfg::kSync = 1), the L2 prefetch routes (Cfg::kPrefetch
// 1 bulk, 2 none, 3 sectors) and distances (Cfg::kAhead), with the default pipe.
TEST(MlaSm90Nvrtc, SyncAndPrefetchVariantsCompileWithoutSpills) {
  for (int prefetch : {0, 1, 2, 3}) {
    for (int cluster : {1, 2}) {
      for (int sync : {0, 1}) {
        if (sync == 1 && cluster == 1) continue;
        // (One producer's pipe 2 without any L2 prefetch and without a cluster spilled 8 B from
        // fill_nan_outputs until the partition was loaded beside the stamp.)
        expect_clean_compile(test::mla_sm90_spec(64, cluster, 0, 2, 0, sync, prefetch));
      }
    }
  }
  expect_clean_compile(test::mla_sm90_spec(1, 2, 0, 2, 0, 1, 1));
  for (int ahead : {1, 4}) expect_clean_compile(test::mla_sm90_spec(64, 1, 0, 2, 0, 0, 0, ahead));
  // The gather's L1 evict-last policy (Cfg::kL1 = 1), both splits.
  for (int map : {0, 1}) expect_clean_compile(test::mla_sm90_spec(64, 1, 0, 2, 0, 0, 0, 2, map, 1));
}

// The pair exchange and the whole-row pieces (Cfg::kMap = 2, 3): in a cluster with pipes 1-3,
// one and two producer warpgroups, pages 1 and 64, the L1 evict-last loads, the plan's cluster
// defaults with the ablations.
TEST(MlaSm90Nvrtc, PairAndRowMapVariantsCompileWithoutSpills) {
  for (int map : {2, 3}) {
    for (int pipe : {1, 2, 3}) expect_clean_compile(test::mla_sm90_spec(64, 2, 0, pipe, 0, 1, 0, 1, map, 0, 2, 0, 1));
    expect_clean_compile(test::mla_sm90_spec(1, 2, 0, 2, 0, 1, 0, 1, map, 0, 2, 0, 1));
    expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 2, 0, 1, 0, 1, map, 0, 2, 0, 2));
    expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 2, 0, 1, 0, 1, map, 1, 2, 0, 1));
    for (int ablate : {1, 4, 5}) {
      expect_clean_compile(test::mla_sm90_spec(64, 2, ablate, 2, 0, 1, 0, 1, map, 0, 2, 0, 1), true);
    }
  }
  // The rows without a cluster: the plan's producers there (two, pipe 2 with the L1 evict-last
  // loads, P after P V; at 80 registers: it spilled 4 bytes until the stores' two bases and the
  // record addresses outside the id's branch freed registers), pipe 1, one producer's pipe 1 (its
  // whole share in one round, pipes 2 and 3, spills: mla_sm90_consistent leaves the rows out
  // there), page 1; and the cluster default (two producers) with its ablations.
  for (int page : {1, 64, 128}) {
    expect_clean_compile(test::mla_sm90_spec(page, 1, 0, 2, 0, 0, 0, 1, 3, 1, 2, 2, 2));
  }
  expect_clean_compile(test::mla_sm90_spec(64, 1, 0, 1, 0, 0, 0, 1, 3, 0, 2, 2, 2));
  expect_clean_compile(test::mla_sm90_spec(1, 1, 0, 1, 0, 0, 0, 1, 3, 0, 2, 2, 2));
  expect_clean_compile(test::mla_sm90_spec(64, 1, 0, 1, 0, 0, 0, 1, 3, 0, 2, 2, 1));
  for (int ablate : {1, 2, 3, 4, 5, 6}) {
    expect_clean_compile(test::mla_sm90_spec(64, 2, ablate, 2, 0, 1, 0, 1, 3, 0, 2, 0, 2), true);
  }
  // The integer placement in rows (Cfg::kDequant 1): two producers' pipe 2, one producer's pipe
  // 3 in a cluster.
  expect_clean_compile(test::mla_sm90_spec(64, 1, 0, 2, 1, 0, 0, 1, 3, 1, 2, 2, 2));
  expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 2, 1, 1, 0, 1, 3, 0, 2, 0, 2));
  expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 3, 1, 1, 0, 1, 3, 0, 2, 0, 1));
  // The peer's rows by bulk copies (Cfg::kPeerCopy 1): two and one producers, rows and units.
  expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 2, 0, 1, 0, 1, 3, 0, 2, 0, 2, 1));
  expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 2, 0, 1, 0, 1, 3, 0, 2, 0, 1, 1));
  expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 1, 0, 1, 0, 1, 0, 0, 2, 0, 2, 1));
  expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 3, 0, 1, 0, 1, 3, 0, 2, 0, 1, 1));
  // Each side alone (consumers only, producers only with and without the gather), both defaults.
  for (int ablate : {7, 8, 9}) {
    expect_clean_compile(test::mla_sm90_spec(64, 2, ablate, 2, 0, 1, 0, 1, 3, 0, 2, 0, 2), true);
    expect_clean_compile(test::mla_sm90_spec(64, 1, ablate, 2, 0, 0, 0, 1, 3, 1, 2, 2, 2), true);
  }
}

// The records staged in the Q tile by bulk copies (Cfg::kStage 1, at most 16 heads): the plan's
// producers without a cluster (two, pipe 2, rows, L1 evict-last, P after P V), every page size
// kind, the prefetch one to three blocks ahead, the timeline; the ablations (timing only).
TEST(MlaSm90Nvrtc, StagedRecordVariantsCompileWithoutSpills) {
  for (int page : {1, 64, 128}) {
    expect_clean_compile(test::mla_sm90_spec(page, 1, 0, 2, 0, 0, 0, 2, 3, 1, 2, 2, 2, 0, 0, 0, 1));
  }
  for (int ahead : {1, 3}) expect_clean_compile(test::mla_sm90_spec(64, 1, 0, 2, 0, 0, 0, ahead, 3, 1, 2, 2, 2, 0, 0, 0, 1));
  expect_clean_compile(test::mla_sm90_spec(64, 1, 0, 2, 0, 0, 0, 2, 3, 1, 2, 2, 2, 0, 2, 0, 1));
  for (int ablate : {1, 2, 3, 7, 8, 9}) {
    expect_clean_compile(test::mla_sm90_spec(64, 1, ablate, 2, 0, 0, 0, 2, 3, 1, 2, 2, 2, 0, 0, 0, 1), true);
  }
}

// S^T = K Q^T with the heads on N (Cfg::kNarrow 1, at most 16 heads): with and without the staged
// records, the plan's producers without a cluster, every page size kind, one producer's pipes,
// P's hand-over after P V or before it, the prefetch one and two blocks ahead, the timeline; the
// ablations (timing only).
TEST(MlaSm90Nvrtc, NarrowConsumerVariantsCompileWithoutSpills) {
  for (int stage : {0, 1}) {
    for (int page : {1, 64, 128}) {
      expect_clean_compile(test::mla_sm90_spec(page, 1, 0, 2, 0, 0, 0, 2, 3, 1, 2, 2, 2, 0, 0, 0, stage, 1));
    }
    expect_clean_compile(test::mla_sm90_spec(64, 1, 0, 2, 0, 0, 0, 2, 3, 1, 2, 0, 2, 0, 2, 0, stage, 1));
    expect_clean_compile(test::mla_sm90_spec(64, 1, 0, 2, 0, 0, 0, 1, 3, 1, 2, 2, 2, 0, 0, 0, stage, 1));
    for (int ablate : {1, 2, 3, 7, 8, 9}) {
      expect_clean_compile(test::mla_sm90_spec(64, 1, ablate, 2, 0, 0, 0, 2, 3, 1, 2, 2, 2, 0, 0, 0, stage, 1), true);
    }
  }
  // One producer's round stream (pipe 4) spills 12 B with them since the P V with the heads on
  // N too (a knob combination, never a plan's).
  for (int pipe : {1, 4}) {
    expect_clean_compile(test::mla_sm90_spec(64, 1, 0, pipe, 0, 0, 0, 2, 0, 0, 2, 2, 1, 0, 0, 0, 0, 1), false,
                         pipe == 4 ? 12 : 0);
  }
}

// No bf16 tile (Cfg::kDirect 1..3, at most 16 heads, direct.cuh): every page size kind and the
// launch timeline, each without a spill (the consumers hold O^T, S^T and their A fragments); the
// ablations (timing only).
TEST(MlaSm90Nvrtc, DirectVariantsCompileWithoutSpills) {
  for (int direct : {1, 2, 3}) {
    for (int page : {1, 16, 64, 128}) {
      expect_clean_compile(test::mla_sm90_spec(page, 1, 0, 0, 0, 0, 0, 2, 0, 0, 2, 0, 1, 0, 0, 0, 0, 0, direct));
    }
    expect_clean_compile(test::mla_sm90_spec(64, 1, 0, 0, 0, 0, 0, 2, 0, 0, 2, 0, 1, 0, 2, 0, 0, 0, direct));
    for (int ablate : {2, 3, 8}) {
      expect_clean_compile(test::mla_sm90_spec(64, 1, ablate, 0, 0, 0, 0, 2, 0, 0, 2, 0, 1, 0, 0, 0, 0, 0, direct), true);
    }
  }
}

// The token split of the producer (Cfg::kMap = 1) with every pipe that offers it, both cluster
// sizes, the integer dequantization (pipe 3) and the no-dequant ablation.
TEST(MlaSm90Nvrtc, TokenMapVariantsCompileWithoutSpills) {
  for (int pipe : {1, 2, 3}) {
    for (int cluster : {1, 2}) expect_clean_compile(test::mla_sm90_spec(64, cluster, 0, pipe, 0, cluster - 1, 0, 2, 1));
  }
  for (int cluster : {1, 2}) expect_clean_compile(test::mla_sm90_spec(64, cluster, 0, 3, 1, cluster - 1, 0, 2, 1));
  expect_clean_compile(test::mla_sm90_spec(1, 1, 0, 2, 0, 0, 0, 2, 1));
  expect_clean_compile(test::mla_sm90_spec(64, 1, 1, 2, 0, 0, 0, 2, 1), true);
}

// The consumers' rescale policies (Cfg::kRescale 1, 2) with the default producers (pipe 4 without
// a cluster, pipe 2 in one), P in consumer 1's registers (Cfg::kPHand = 1, pipes 0-2) and P
// handed over after consumer 0's P V (Cfg::kPHand = 2), pages 1 and 64.
TEST(MlaSm90Nvrtc, ConsumerVariantsCompileWithoutSpills) {
  for (int page : {1, 64}) {
    for (int rescale : {0, 1, 2}) {
      expect_clean_compile(test::mla_sm90_spec(page, 1, 0, 4, 0, 0, 0, 2, 0, 0, rescale));
      for (int phand : {0, 1}) {
        if (rescale == 0 && phand == 0) continue;
        expect_clean_compile(test::mla_sm90_spec(page, 2, 0, 2, 0, 1, 0, 2, 0, 0, rescale, phand));
      }
    }
  }
  // One producer with P in consumer 1's registers in a cluster: pipe 1 spills 16 B since the
  // outputs leave through shared memory (ba3517b; one producer is a knob, never a plan's default).
  for (int pipe : {0, 1}) {
    expect_clean_compile(test::mla_sm90_spec(64, 2, 0, pipe, 0, 1, 0, 2, 0, 0, 2, 1), false, pipe == 1 ? 16 : 0);
  }
  // P handed over after consumer 0's own P V is issued (Cfg::kPHand = 2), both default producers.
  for (int page : {1, 64}) {
    expect_clean_compile(test::mla_sm90_spec(page, 1, 0, 4, 0, 0, 0, 2, 0, 0, 2, 2));
    expect_clean_compile(test::mla_sm90_spec(page, 2, 0, 2, 0, 1, 0, 2, 0, 0, 2, 2));
  }
  // With the other producers the environment may pick (pipe 2 without a cluster spills: not offered).
  for (int pipe : {0, 1, 3}) expect_clean_compile(test::mla_sm90_spec(64, 1, 0, pipe, 0, 0, 0, 2, 0, 0, 2, 2));
  expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 3, 0, 1, 0, 2, 0, 0, 2, 2));
  // The defaults of a cluster: the prefetch one block ahead.
  expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 2, 0, 1, 0, 1, 0, 0, 2, 0));
  // One producer's pipe 2 without a cluster with P in consumer 1's registers: 12 B since the
  // producers' cursors keep their requests' index rows (c2eb48a), 8 B since the outputs leave
  // through shared memory (ba3517b).
  expect_clean_compile(test::mla_sm90_spec(64, 1, 0, 2, 0, 0, 0, 2, 0, 0, 2, 1), false, 8);
  // The ablations the timing test runs beside them.
  for (int ablate : {1, 2}) expect_clean_compile(test::mla_sm90_spec(64, 2, ablate, 2, 0, 1, 0, 2, 0, 0, 2, 1), true);
}

// Two producer warpgroups (Cfg::kProducers = 2): pipe 1 with both cluster sizes and the
// consumers' defaults of each, pipes 2 and 3 in a cluster, page sizes 1 and 128, the ablations.
TEST(MlaSm90Nvrtc, TwoProducerVariantsCompileWithoutSpills) {
  for (int page : {1, 64, 128}) {
    expect_clean_compile(test::mla_sm90_spec(page, 1, 0, 1, 0, 0, 0, 2, 0, 0, 2, 2, 2));
    expect_clean_compile(test::mla_sm90_spec(page, 2, 0, 1, 0, 1, 0, 1, 0, 0, 2, 0, 2));
  }
  for (int pipe : {2, 3}) expect_clean_compile(test::mla_sm90_spec(64, 2, 0, pipe, 0, 1, 0, 1, 0, 0, 2, 0, 2));
  // The stream of small rounds (pipe 4), both cluster sizes, every page size kind, the ablations.
  for (int page : {1, 64, 128}) {
    expect_clean_compile(test::mla_sm90_spec(page, 1, 0, 4, 0, 0, 0, 1, 0, 0, 2, 2, 2));
    expect_clean_compile(test::mla_sm90_spec(page, 2, 0, 4, 0, 1, 0, 1, 0, 0, 2, 0, 2));
  }
  expect_clean_compile(test::mla_sm90_spec(64, 1, 0, 4, 0, 0, 0, 2, 0, 0, 2, 2, 2));
  for (int ablate : {1, 2}) expect_clean_compile(test::mla_sm90_spec(64, 1, ablate, 4, 0, 0, 0, 1, 0, 0, 2, 2, 2), true);
  expect_clean_compile(test::mla_sm90_spec(64, 1, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 2));
  expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 2, 0, 1, 0, 1, 0, 0, 2, 2, 2));
  for (int ablate : {1, 2}) {
    expect_clean_compile(test::mla_sm90_spec(64, 1, ablate, 1, 0, 0, 0, 2, 0, 0, 2, 2, 2), true);
    expect_clean_compile(test::mla_sm90_spec(64, 2, ablate, 2, 0, 1, 0, 1, 0, 0, 2, 0, 2), true);
  }
  // P in consumer 1's registers in a cluster (producers at 56 registers): pipes 1 and 2, the
  // rows and the unit split, every page size kind, the ablations.
  for (int page : {1, 64, 128}) expect_clean_compile(test::mla_sm90_spec(page, 2, 0, 2, 0, 1, 0, 1, 3, 0, 2, 1, 2));
  expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 1, 0, 1, 0, 1, 3, 0, 2, 1, 2));
  expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 1, 0, 1, 0, 1, 0, 0, 2, 1, 2));
  for (int ablate : {1, 2}) expect_clean_compile(test::mla_sm90_spec(64, 2, ablate, 2, 0, 1, 0, 1, 3, 0, 2, 1, 2), true);
}

// The cycle stamps (Cfg::kStamp, a timing aid) on both defaults: they compile and keep every
// wgmma in flight (a printf there had serialized them); without a cluster ptxas spills a little
// (8 B stored, 16 loaded: timing only).
TEST(MlaSm90Nvrtc, StampsCompileWithoutSerializing) {
  expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 2, 0, 1, 0, 1, 3, 0, 2, 0, 2, 0, 1));
  expect_clean_compile(test::mla_sm90_spec(64, 1, 0, 2, 0, 0, 0, 1, 3, 1, 2, 2, 2, 0, 1), true);
  // The launch timeline (Cfg::kStamp = 2) on both defaults, as the plans pick them (P in
  // consumer 1's registers in a cluster, after its own P V without one).
  expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 2, 0, 1, 0, 1, 3, 0, 2, 1, 2, 0, 2));
  expect_clean_compile(test::mla_sm90_spec(64, 1, 0, 2, 0, 0, 0, 1, 3, 1, 2, 2, 2, 0, 2));
  for (int seesaw : {1, 2}) expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 2, 0, 1, 0, 1, 3, 0, 2, 0, 2, 0, 1, seesaw));
}

// The next block's QK^T issued behind consumer 0's P V (Cfg::kPHand = 3): every producer it is
// offered with (pipes 0, 1 and 4 without a cluster, 0-4 in one; one and two producer warpgroups),
// pages 1, 64 and 128, the ablations. expect_clean_compile also fails on a serialized wgmma: the
// overlap is only worth having while ptxas keeps P V and QK^T in flight together.
TEST(MlaSm90Nvrtc, QkBehindPvCompilesWithoutSpills) {
  for (int page : {1, 64, 128}) {
    expect_clean_compile(test::mla_sm90_spec(page, 1, 0, 1, 0, 0, 0, 1, 0, 0, 2, 3, 2));
    expect_clean_compile(test::mla_sm90_spec(page, 2, 0, 2, 0, 1, 0, 1, 0, 0, 2, 3, 1));
  }
  // One producer's pipe 1 without a cluster: 4 B since the outputs leave through shared memory
  // (ba3517b).
  for (int pipe : {0, 1, 4}) {
    expect_clean_compile(test::mla_sm90_spec(64, 1, 0, pipe, 0, 0, 0, 1, 0, 0, 2, 3, 1), false, pipe == 1 ? 4 : 0);
  }
  for (int pipe : {0, 1, 3, 4}) expect_clean_compile(test::mla_sm90_spec(64, 2, 0, pipe, 0, 1, 0, 1, 0, 0, 2, 3, 1));
  expect_clean_compile(test::mla_sm90_spec(64, 1, 0, 4, 0, 0, 0, 1, 0, 0, 2, 3, 2));
  for (int pipe : {1, 2, 4}) expect_clean_compile(test::mla_sm90_spec(64, 2, 0, pipe, 0, 1, 0, 1, 0, 0, 2, 3, 2));
  expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 2, 0, 1, 0, 1, 0, 0, 0, 3, 1));
  for (int ablate : {1, 2}) {
    expect_clean_compile(test::mla_sm90_spec(64, 1, ablate, 1, 0, 0, 0, 1, 0, 0, 2, 3, 2), true);
    expect_clean_compile(test::mla_sm90_spec(64, 2, ablate, 2, 0, 1, 0, 1, 0, 0, 2, 3, 1), true);
  }
}

// The seesaw consumers (Cfg::kSeesaw = 1: alternate blocks, 200 registers each, producers at 56):
// pipes 1 and 2 in a cluster, the rows and the unit split, every page size kind, the timing
// ablations. A serialized wgmma would cost the overlap its point: expect_clean_compile fails on it.
TEST(MlaSm90Nvrtc, SeesawConsumersCompileWithoutSpills) {
  for (int page : {1, 64, 128}) {
    expect_clean_compile(test::mla_sm90_spec(page, 2, 0, 2, 0, 1, 0, 1, 3, 0, 2, 0, 2, 0, 0, 1));
  }
  expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 1, 0, 1, 0, 1, 3, 0, 2, 0, 2, 0, 0, 1));
  expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 2, 0, 1, 0, 1, 0, 0, 2, 0, 2, 0, 0, 1));
  for (int rescale : {0, 1}) expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 1, 0, 1, 0, 2, 0, 0, rescale, 0, 2, 0, 0, 1));
  // The other's block taken before the tile wait (Cfg::kSeesaw = 2).
  for (int page : {1, 64}) expect_clean_compile(test::mla_sm90_spec(page, 2, 0, 2, 0, 1, 0, 1, 3, 0, 2, 0, 2, 0, 0, 2));
  for (int ablate : {2, 7}) expect_clean_compile(test::mla_sm90_spec(64, 2, ablate, 2, 0, 1, 0, 1, 3, 0, 2, 0, 2, 0, 0, 2), true);
  expect_clean_compile(test::mla_sm90_spec(64, 2, 0, 2, 0, 1, 0, 1, 3, 0, 0, 0, 2, 0, 0, 1));
  for (int ablate : {1, 2, 3, 4, 5, 6, 7, 8, 9}) {
    expect_clean_compile(test::mla_sm90_spec(64, 2, ablate, 2, 0, 1, 0, 1, 3, 0, 2, 0, 2, 0, 0, 1), true);
  }
}

TEST(MlaSm90Nvrtc, SharedMemoryPlanFitsOneCta) {
  static_assert(mla::sm90::kSmemBytes <= 227 * 1024);
  EXPECT_EQ(mla::sm90::kThreads, 384);
  EXPECT_EQ(mla::sm90::threads_of(2), 512);
  EXPECT_EQ(mla::sm90::launch_regs(1), 168);
  EXPECT_EQ(mla::sm90::launch_regs(2), 128);
  EXPECT_EQ(mla::sm90::head_blocks(64), 1);
  EXPECT_EQ(mla::sm90::head_blocks(100), 2);
  EXPECT_EQ(mla::sm90::head_blocks(128), 2);
  std::printf("[smem] %d bytes dynamic per CTA\n", mla::sm90::kSmemBytes);
}

}  // namespace
}  // namespace deca
