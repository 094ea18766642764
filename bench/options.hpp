// How deca-bench runs a case: backend, iteration counts, checking, the GPU timer.
#pragma once

#include <cstdint>

#include "deca/gqa.hpp"

namespace deca::bench {

class GpuTimer;

struct RunOptions {
  bool cuda = false;           // false: the CPU backend
  int device = 0;
  int warmup = 1;
  int iters = 3;
  bool check = false;          // compare with the CPU reference
  int check_requests = 8;      // GPU: requests sampled for --check (the CPU checks all)
  KvLayout layout = KvLayout::kNHD;
  int host_calls = 0;          // --host-cost: gqa_decode calls timed for the host cost (0: off)
  bool checked = false;        // plans with GqaConfig / MlaConfig::checked (--checked's second pass)
  // MLA sparse on the GPU: schedule in every timed run (true) or once, the later runs reusing
  // it as the other layers of a decode step do (MlaSparseArgs::reuse_schedule; how FlashMLA is
  // timed, its metadata made outside the timed calls).
  bool mla_schedule_every = false;
  // --skip-softmax F: GQA cases planned with GqaConfig::skip_softmax_factor F and measured
  // against the exact kernel on the same data (skip_bench.hpp); --dist peaked: that data
  // distribution instead of uniform random values.
  float skip_softmax = 0.f;
  bool peaked = false;
  bool fused = false;           // --fused: GQA cases also time the fused decode step
  int layers = 0;               // --layers L: GQA cases also time L layers in a graph, PDL on / off
  bool stamps = false;          // --stamps: GQA cases on the GPU also run their kernel's stamp build
  std::uint64_t seed = 0;      // fresh per run; each case derives its own from it
  GpuTimer* timer = nullptr;   // set when cuda
};

}  // namespace deca::bench
