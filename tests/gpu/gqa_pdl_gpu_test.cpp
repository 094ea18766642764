// Programmatic dependent launch on the GPU (gqa_launch_options: the attribute on sm_90+; each GQA
// kernel waits on griddepcontrol at its entry and lets the next grid launch after its main loop):
// a chain of launches of one plan, as consecutive layers, where each layer's q is what the layer
// before wrote (q and out ping-pong between two buffers, so a layer also overwrites what the layer
// before read), every layer on the same workspace (the split counters reset by one launch are the
// next one's), and, for fused plans, each layer appending its own new tokens to the cache slots
// the layer before attended to. Launched back to back with the attribute, and captured in a graph
// and replayed, the chain must give the bits of the same launches without the attribute, each
// waited for before the next.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/fused_gqa_case.hpp"
#include "cuda/gqa_spec.hpp"
#include "gpu/device_buffer.hpp"
#include "gpu/gqa_gpu_runner.hpp"

namespace deca::test {
namespace {

constexpr int kLayers = 6;

struct ChainCase {
  std::string name;
  GqaCaseSpec spec;
  GpuOptions opt;
  bool checked = true;
  bool fused = false;
  bool splits = false;  // the plan must split the keys (checked below)
};

// Two requests, one long: split-KV, whose merge is the launch's tail.
ChainCase split_case(const std::string& name, DType kv) {
  ChainCase c;
  c.name = name;
  c.spec = base_spec(64, 8, 128, 64, kv);
  c.spec.batch = 2;
  c.spec.seq_lens = {12000, 300};
  c.splits = true;
  return c;
}

std::vector<ChainCase> chain_cases() {
  std::vector<ChainCase> v;
  v.push_back(split_case("bf16_hopper_split", DType::kBF16));
  v.back().opt.hopper_16bit = 1;
  v.push_back(split_case("bf16_portable_split", DType::kBF16));
  v.back().opt.hopper_16bit = 0;
  v.push_back(split_case("fp8_split", DType::kFP8E4M3));
  v.push_back(split_case("int8_split", DType::kINT8));
  v.push_back(split_case("bf16_unchecked_split", DType::kBF16));
  v.back().checked = false;
  v.push_back(split_case("fp8_rows_on_m_q4", DType::kFP8E4M3));
  v.back().spec.q_len = 4;
  v.back().spec.seq_lens = {3000, 40};
  v.back().splits = false;
  v.push_back(split_case("bf16_one_wave_no_split", DType::kBF16));
  v.back().spec.batch = 48;
  v.back().spec.seq_lens.assign(48, 700);
  v.back().splits = false;
  for (DType kv : {DType::kBF16, DType::kFP8E4M3}) {
    v.push_back(split_case(std::string("fused_") + dtype_name(kv) + "_split", kv));
    v.back().fused = true;
  }
  v.push_back(split_case("fused_int8_q2", DType::kINT8));
  v.back().fused = true;
  v.back().spec.q_len = 2;
  v.back().spec.seq_lens = {900, 2};
  v.back().splits = false;
  return v;
}

// The chain's device state: the case (its cache, page table, lengths, workspace), q / out in two
// buffers, each layer's LSE, and for fused plans each layer's new tokens.
struct Chain {
  GqaCase& c;
  const GqaPlan& plan;
  DeviceCase dev;
  DeviceBuffer qo[2];
  std::vector<DeviceBuffer> lse, k_new, v_new;
  DeviceBuffer cos_sin;
  std::vector<GqaParams> layer;

  Chain(GqaCase& c_, const GqaPlan& plan_, const std::vector<FusedInputs>& fused)
      : c(c_), plan(plan_), dev(c_, plan_) {
    const auto& s = c.spec;
    qo[0] = DeviceBuffer(c.q.bytes());
    qo[1] = DeviceBuffer(c.q.bytes());
    if (!fused.empty()) {
      bind_fused(dev.params, c, fused[0]);
      cos_sin = DeviceBuffer(fused[0].cos_sin);
      dev.params.cos_sin = cos_sin.get();
      dev.params.positions = nullptr;
    }
    for (int i = 0; i < kLayers; ++i) {
      GqaParams p = dev.params;
      p.q = qo[i % 2].get();
      p.out = qo[(i + 1) % 2].get();
      p.q_stride_head = p.out_stride_head = s.head_dim;
      p.q_stride_token = p.out_stride_token = static_cast<long long>(s.num_q_heads) * s.head_dim;
      p.q_stride_batch = p.out_stride_batch = static_cast<long long>(s.q_len) * p.q_stride_token;
      lse.emplace_back(c.lse.bytes());
      p.lse = lse.back().as<float>();
      if (!fused.empty()) {
        k_new.emplace_back(fused[i].k_new);
        v_new.emplace_back(fused[i].v_new);
        p.k_new = k_new.back().get();
        p.v_new = v_new.back().get();
      }
      layer.push_back(p);
    }
  }

  // The state every run starts from: the case's q, poisoned out and LSE, the cache as built (a
  // fused chain rewrote its new tokens' slots). The workspace stays as the last run left it.
  void reset() const {
    qo[0].from_host(c.q);
    qo[1].fill(0xFF);
    for (const DeviceBuffer& b : lse) b.fill(0xFF);
    dev.k.from_host(c.k_pool);
    if (!c.spec.kv_one_allocation) dev.v.from_host(c.v_pool);
    cuda_ok(cudaDeviceSynchronize(), "reset");
  }

  void launch(cudaStream_t stream, bool pdl, bool wait_each) const {
    for (int i = 0; i < kLayers; ++i) {
      cuda::gqa_decode(plan, layer[i], stream, true, pdl);
      if (wait_each) cuda_ok(cudaStreamSynchronize(stream), plan.kernel_name.c_str());
    }
  }

  // The last layer's q and output, every layer's LSE and the cache, as bytes.
  std::vector<HostTensor> results() const {
    std::vector<HostTensor> r;
    for (const DeviceBuffer& b : qo) {
      r.emplace_back(c.q.dtype(), c.q.shape());
      b.to_host(r.back());
    }
    for (const DeviceBuffer& b : lse) {
      r.emplace_back(DType::kFP32, c.lse.shape());
      b.to_host(r.back());
    }
    r.emplace_back(c.k_pool.dtype(), c.k_pool.shape());
    dev.k.to_host(r.back());
    return r;
  }
};

void expect_same(const std::vector<HostTensor>& want, const std::vector<HostTensor>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(same_bytes(want[i], got[i])) << what << ": result " << i
                                             << " (0, 1: q / out buffers; then each layer's LSE; last: K pool)";
  }
}

// Programmatic edges between the captured launches: kLayers - 1 where the attribute is set.
int programmatic_edges(cudaGraph_t graph) {
  std::size_t n = 0;
  if (cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n) != cudaSuccess) return -1;
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  if (cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n) != cudaSuccess) return -1;
  int count = 0;
  for (const cudaGraphEdgeData& e : data) count += e.type == cudaGraphDependencyTypeProgrammatic;
  return count;
}

// On the host (runs without a GPU too): every chain case is one the test can run, its output
// usable as the next layer's q and its fused inputs within the fused step's contract.
TEST(GqaPdlChainCases, AreValid) {
  for (const ChainCase& cc : chain_cases()) {
    EXPECT_EQ(cc.spec.q_dtype, cc.spec.out_dtype) << cc.name;
    if (!cc.fused) continue;
    auto rng = make_rng(32);
    GqaCase c = build_gqa_case(cc.spec, rng);
    EXPECT_NO_THROW((void)make_fused_inputs(c, FusedSpec{}, rng)) << cc.name;
  }
}

class GqaPdlGpu : public ::testing::TestWithParam<ChainCase> {};

TEST_P(GqaPdlGpu, LayerChainGivesTheSerialBits) {
  DECA_REQUIRE_GPU();
  const ChainCase& cc = GetParam();
  auto rng = make_rng(32);
  GqaCase c = build_gqa_case(cc.spec, rng);
  ASSERT_EQ(cc.spec.q_dtype, cc.spec.out_dtype) << "the chain feeds each layer's output to the next as q";
  std::vector<FusedInputs> fused;
  for (int i = 0; cc.fused && i < kLayers; ++i) fused.push_back(make_fused_inputs(c, FusedSpec{}, rng));
  GqaPlan plan;
  plan.config = gpu_config(c, cc.opt);
  plan.config.checked = cc.checked;
  if (cc.fused) plan.config.rope_style = RopeStyle::kNeox;
  plan_with(plan, cc.opt);
  if (cc.splits) ASSERT_GT(plan.num_splits, 1) << plan.kernel_name;
  const bool pdl = cuda::gqa_launch_options(cuda::compute_capability(plan.config.device.index)).pdl;
  std::printf("[gpu] pdl chain %-24s %-64s splits=%-3d pdl=%d\n", cc.name.c_str(), plan.kernel_name.c_str(),
              plan.num_splits, pdl ? 1 : 0);
  Chain chain(c, plan, fused);
  GraphReplay graph;

  // Serial, without the attribute: the reference bits.
  chain.reset();
  chain.launch(graph.stream(), /*pdl=*/false, /*wait_each=*/true);
  const std::vector<HostTensor> serial = chain.results();
  check_gqa_run(plan, chain.dev.ws.get(), nullptr);

  // Back to back with the attribute.
  chain.reset();
  chain.launch(graph.stream(), /*pdl=*/true, /*wait_each=*/false);
  cuda_ok(cudaStreamSynchronize(graph.stream()), plan.kernel_name.c_str());
  expect_same(serial, chain.results(), "back to back, PDL");

  // Captured (the capture's warm-up run is one more chain), replayed three times from the start.
  ASSERT_NO_FATAL_FAILURE(graph.capture([&](cudaStream_t s) { chain.launch(s, true, false); }));
  EXPECT_EQ(programmatic_edges(graph.graph()), pdl ? kLayers - 1 : 0) << plan.kernel_name;
  for (int rep = 0; rep < 3; ++rep) {
    chain.reset();
    ASSERT_NO_FATAL_FAILURE(graph.replay(1));
    expect_same(serial, chain.results(), "graph replay " + std::to_string(rep));
  }
  check_gqa_run(plan, chain.dev.ws.get(), nullptr);
}

INSTANTIATE_TEST_SUITE_P(Chain, GqaPdlGpu, ::testing::ValuesIn(chain_cases()),
                         [](const auto& info) { return info.param.name; });

// The same chain captured without the attribute has no programmatic edge (deca-bench --layers'
// baseline is what it says).
TEST(GqaPdlGpuGraph, WithoutTheAttributeNoProgrammaticEdge) {
  DECA_REQUIRE_GPU();
  ChainCase cc = chain_cases()[2];
  auto rng = make_rng(33);
  GqaCase c = build_gqa_case(cc.spec, rng);
  const GqaPlan plan = gpu_plan(c, cc.opt);
  Chain chain(c, plan, {});
  GraphReplay graph;
  chain.reset();
  ASSERT_NO_FATAL_FAILURE(graph.capture([&](cudaStream_t s) { chain.launch(s, false, false); }));
  EXPECT_EQ(programmatic_edges(graph.graph()), 0);
}

}  // namespace
}  // namespace deca::test
