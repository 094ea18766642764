// The JitSpec of the sm90a MLA sparse decode kernel for one page size and cluster size, as the
// tests build it (the CUDA backend renders its own from the same prologue: Cfg::kPageSize and
// Cfg::kCluster, then the entry).
#pragma once

#include <string>

#include "jit/spec.hpp"

namespace deca::test {

// `ablate`: 0 the kernel, 1 without the dequantization, 2 without the tensor cores (timing only).
// `pipe`: Cfg::kPipe, the producer pipeline variant (kernels/mla/sm90/traits.cuh, enum Pipe).
// `dequant`: Cfg::kDequant, 0 the hardware conversions, 1 the integer placement (dequant.cuh).
// `rescale`, `phand`, `producers`, `peer_copy`: Cfg::kRescale, kPHand, kProducers, kPeerCopy (knobs.cuh).
// `stamp`: Cfg::kStamp, the cycle stamps (stamps.cuh; a timing aid).
// `seesaw`: Cfg::kSeesaw, the consumers taking alternate blocks (seesaw.cuh).
// `stage`, `narrow`, `direct`: Cfg::kStage, kNarrow, kDirect (at most 16 heads; direct.cuh for the last).
inline jit::JitSpec mla_sm90_spec(int page_size, int cluster = 1, int ablate = 0, int pipe = 0,
                                  int dequant = 0, int sync = 0, int prefetch = 0, int ahead = 2,
                                  int map = 0, int l1 = 0, int rescale = 0, int phand = 0,
                                  int producers = 1, int peer_copy = 0, int stamp = 0,
                                  int seesaw = 0, int stage = 0, int narrow = 0, int direct = 0) {
  jit::JitSpec spec;
  spec.name = "mla_sparse_sm90_test_p" + std::to_string(page_size) + "_c" + std::to_string(cluster) +
              "_a" + std::to_string(ablate) + (pipe != 0 ? "_k" + std::to_string(pipe) : "") +
              (dequant != 0 ? "_d" + std::to_string(dequant) : "") +
              (sync != 0 ? "_s" + std::to_string(sync) : "") + (prefetch != 0 ? "_f" + std::to_string(prefetch) : "") +
              (ahead != 2 ? "_a" + std::to_string(ahead) : "") + (map != 0 ? "_m" + std::to_string(map) : "") +
              (l1 != 0 ? "_l" + std::to_string(l1) : "") + (rescale != 0 ? "_r" + std::to_string(rescale) : "") +
              (phand != 0 ? "_h" + std::to_string(phand) : "") +
              (producers != 1 ? "_w" + std::to_string(producers) : "") + (peer_copy != 0 ? "_bulk" : "") +
              (stamp != 0 ? "_stamp" + std::to_string(stamp) : "") + (seesaw != 0 ? "_see" + std::to_string(seesaw) : "") +
              (stage != 0 ? "_stage" : "") + (narrow != 0 ? "_narrow" : "") + (direct != 0 ? "_direct" + std::to_string(direct) : "");
  spec.source = "struct Cfg {\n  static constexpr int kPageSize = " + std::to_string(page_size) +
                ";\n  static constexpr int kCluster = " + std::to_string(cluster) +
                ";\n  static constexpr int kAblate = " + std::to_string(ablate) +
                ";\n  static constexpr int kPipe = " + std::to_string(pipe) +
                ";\n  static constexpr int kDequant = " + std::to_string(dequant) +
                ";\n  static constexpr int kSync = " + std::to_string(sync) +
                ";\n  static constexpr int kPrefetch = " + std::to_string(prefetch) +
                ";\n  static constexpr int kAhead = " + std::to_string(ahead) +
                ";\n  static constexpr int kMap = " + std::to_string(map) +
                ";\n  static constexpr int kL1 = " + std::to_string(l1) +
                ";\n  static constexpr int kRescale = " + std::to_string(rescale) +
                ";\n  static constexpr int kPHand = " + std::to_string(phand) +
                ";\n  static constexpr int kProducers = " + std::to_string(producers) +
                ";\n  static constexpr int kPeerCopy = " + std::to_string(peer_copy) +
                ";\n  static constexpr int kStamp = " + std::to_string(stamp) +
                ";\n  static constexpr int kSeesaw = " + std::to_string(seesaw) +
                ";\n  static constexpr int kStage = " + std::to_string(stage) +
                ";\n  static constexpr int kNarrow = " + std::to_string(narrow) +
                ";\n  static constexpr int kDirect = " + std::to_string(direct) +
                ";\n};\n#include \"kernels/mla/sm90/entry.cuh\"\n";
  spec.entry = "deca_mla_sparse_decode_sm90";
  spec.arch = 90;
  return spec;
}

}  // namespace deca::test
