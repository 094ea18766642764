// The LSE convention for rows without a valid key (MlaSparseParams / MlaDenseParams::lse_empty,
// MlaConfig::lse_of_empty_row): kMlaLseEmptyPosInf turns exactly those rows' LSE from -inf into
// +inf; every output value and every other LSE stays bitwise the same.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/mla_case.hpp"
#include "common/mla_lse_empty.hpp"
#include "common/test_seed.hpp"
#include "cpu/reference.hpp"

namespace deca::test {
namespace {

// Runs `decode` on `params` with each convention (the outputs poisoned before each run) and
// compares them (expect_lse_conventions_agree). Returns the number of empty rows seen.
template <class Params, class Decode>
int expect_only_empty_rows_change(Params& params, HostTensor& out, HostTensor& lse, Decode decode) {
  out.fill_bytes(0xFF);
  lse.fill_bytes(0xFF);
  params.lse_empty = kMlaLseEmptyNegInf;
  decode(params);
  const HostTensor out_neg = out, lse_neg = lse;
  out.fill_bytes(0xFF);
  lse.fill_bytes(0xFF);
  params.lse_empty = kMlaLseEmptyPosInf;
  decode(params);
  return expect_lse_conventions_agree("reference", out_neg, lse_neg, out, lse);
}

TEST(MlaLseEmpty, SparsePlusInfOnlyForRowsWithoutKeys) {
  DECA_SEED_TRACE();
  MlaCaseSpec s;
  s.batch = 3;
  s.q_len = 2;
  s.topk = 8;
  s.attn_sink = true;
  s.topk_length = true;
  auto rng = make_rng(71);
  MlaSparseCase c = build_mla_sparse_case(s, rng);
  std::fill_n(c.indices.data<int>(), 8, -1);  // request 0, token 0: every index skipped
  c.topk_length.data<int>()[0] = 8;
  c.topk_length.data<int>()[1] = 0;           // request 1: nothing counts
  c.topk_length.data<int>()[2] = 8;           // request 2: keys (unless all were drawn -1)
  const auto decode = [](const MlaSparseParams& p) { cpu::mla_sparse_decode(p); };
  const int empty = expect_only_empty_rows_change(c.params, c.out, c.lse, decode);
  EXPECT_GE(empty, 3 * s.num_heads);  // request 0's first token and both of request 1's
  EXPECT_LT(empty, c.lse.numel());
}

TEST(MlaLseEmpty, DensePlusInfOnlyForEmptyRequests) {
  DECA_SEED_TRACE();
  MlaCaseSpec s;
  s.batch = 3;
  s.seq_lens = {0, 5, 1};
  s.page_size = 4;
  auto rng = make_rng(72);
  MlaDenseCase c = build_mla_dense_case(s, rng);
  const auto decode = [](const MlaDenseParams& p) { cpu::mla_dense_decode(p); };
  const int empty = expect_only_empty_rows_change(c.params, c.out, c.lse, decode);
  EXPECT_EQ(empty, s.num_heads);  // request 0
}

// The field fills the padding before extra_kv: the GPU kernels' parameter offsets (and so their
// machine code) do not move.
TEST(MlaLseEmpty, SparseParamsLayoutUnchanged) {
  static_assert(offsetof(MlaSparseParams, lse_empty) == offsetof(MlaSparseParams, extra_topk) + sizeof(int));
  static_assert(offsetof(MlaSparseParams, extra_kv) == offsetof(MlaSparseParams, lse_empty) + sizeof(int),
                "lse_empty must fill the hole before extra_kv, not open a new one");
  EXPECT_EQ(offsetof(MlaSparseParams, extra_kv), 208u);
  EXPECT_EQ(sizeof(MlaSparseParams), 256u);
}

}  // namespace
}  // namespace deca::test
