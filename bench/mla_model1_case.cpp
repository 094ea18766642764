#include "mla_model1_case.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "cpu/reference.hpp"
#include "data.hpp"
#include "deca/error.hpp"
#include "deca/mla.hpp"
#include "gpu_timer.hpp"
#include "timing.hpp"

namespace deca::bench {
namespace {

constexpr int kDim = 512;         // d_qk = d_v
constexpr int kRowBytes = 576;    // 448 e4m3 + 64 bf16 RoPE
constexpr int kTokenBytes = 584;  // + 7 scales and a pad byte
constexpr std::uint8_t kScale = 118;  // 2^-9: fill_random's codes become values in [-0.875, 0.875)

long long page_bytes(int page) { return (static_cast<long long>(page) * kTokenBytes + kRowBytes - 1) / kRowBytes * kRowBytes; }

// One cache: every request's `len` tokens in shuffled pages, random e4m3 codes, scales 2^-9, bf16
// RoPE in [-1, 1), pad bytes zero.
struct Cache {
  int page = 64;
  PageTable table;
  Bytes bytes;
  std::size_t size = 0;

  Cache(const std::vector<int>& lengths, int page_size, int len, Rng& rng) : page(page_size) {
    const int max_pages = (len + page - 1) / page;
    table = make_page_table(lengths, page, max_pages, rng);
    size = static_cast<std::size_t>(table.num_pages) * page_bytes(page);
    bytes = alloc_bytes(size);
    fill_random(bytes.get(), DType::kFP8E4M3, size, rng.next());
    std::vector<std::uint16_t> rope(static_cast<std::size_t>(page) * 64);
    for (int b = 0; b < table.num_pages; ++b) {
      std::uint8_t* blk = bytes.get() + b * page_bytes(page);
      fill_random(rope.data(), DType::kBF16, rope.size(), rng.next());
      for (int s = 0; s < page; ++s) {
        std::memcpy(blk + s * kRowBytes + 448, rope.data() + s * 64, 128);
        std::uint8_t* sc = blk + static_cast<long long>(page) * kRowBytes + 8 * s;
        std::memset(sc, kScale, 7);
        sc[7] = 0;
      }
    }
  }
  // `topk` distinct tokens of request b's context (all of them when shorter; -1 after).
  void draw(int b, int len, int topk, std::int32_t* row, Rng& rng) const {
    std::vector<std::uint8_t> seen(len, 0);
    const int take = std::min(topk, len);
    for (int k = 0; k < take;) {
      const int pos = static_cast<int>(rng.below(static_cast<std::uint32_t>(len)));
      if (seen[pos]) continue;
      seen[pos] = 1;
      row[k++] = table.ids[static_cast<std::size_t>(b) * table.max_pages + pos / page] * page + pos % page;
    }
    std::fill(row + take, row + topk, -1);
  }
};

}  // namespace

bool is_model1(const MlaShape& s) { return s.sparse && s.kv_format == kMlaKvModel1; }

CaseResult run_mla_model1_case(const BenchCase& bc, const RunOptions& opt) {
  const MlaShape& s = bc.mla;
  CaseResult r;
  r.name = bc.name;
  r.backend = opt.cuda ? "cuda" : "cpu";
  r.kv_dtype = "model1 (584 B token)";
  r.shape = {{"family", "mla_sparse"}, {"num_heads", s.num_heads},   {"head_dim_qk", kDim},
             {"head_dim_v", kDim},     {"page_size", s.page_size},   {"batch", s.batch},
             {"q_len", s.q_len},       {"seq_len", s.seq_len},       {"topk", s.topk},
             {"extra_topk", s.extra_topk}, {"extra_page_size", s.extra_page_size},
             {"extra_seq_len", s.extra_seq_len}, {"kv_format", "model1"}, {"q_dtype", "bf16"},
             {"out_dtype", "bf16"}};
  const Device device = opt.cuda ? Device::cuda(opt.device) : Device::cpu();
  MlaPlan plan;
  try {
    plan = plan_mla_decode(mla_config(s, device, opt.checked));
  } catch (const Error& e) {
    r.skipped = std::string("no MLA MODEL1 plan in this build (") + e.what() + ")";
    return r;
  }
  r.num_splits = plan.num_splits;
  r.kernel_name = plan.kernel_name;

  Rng rng(opt.seed ^ std::hash<std::string>{}(bc.name));
  const std::vector<int> lengths(s.batch, s.seq_len), extra_lengths(s.batch, s.extra_seq_len);
  const Cache kv(lengths, s.page_size, s.seq_len, rng);
  std::optional<Cache> extra;
  if (s.extra_topk > 0) extra.emplace(extra_lengths, s.extra_page_size, s.extra_seq_len, rng);
  const std::int64_t B = s.batch, Q = s.q_len, H = s.num_heads;
  const std::size_t q_elems = static_cast<std::size_t>(B * Q * H * kDim);
  Bytes q = alloc_bytes(q_elems * 2), out = alloc_bytes(q_elems * 2);
  fill_random(q.get(), DType::kBF16, q_elems, rng.next());
  std::memset(out.get(), 0xFF, q_elems * 2);  // NaN: a row never written fails --check
  std::vector<float> lse(static_cast<std::size_t>(B * Q * H));
  std::vector<std::int32_t> idx(static_cast<std::size_t>(B * Q) * s.topk);
  std::vector<std::int32_t> extra_idx(static_cast<std::size_t>(B * Q) * s.extra_topk);
  for (int b = 0; b < s.batch; ++b) {
    for (int i = 0; i < s.q_len; ++i) {
      kv.draw(b, s.seq_len, s.topk, idx.data() + (b * Q + i) * s.topk, rng);
      if (extra) extra->draw(b, s.extra_seq_len, s.extra_topk, extra_idx.data() + (b * Q + i) * s.extra_topk, rng);
    }
  }

  // The CPU reference's params over the host data (--check).
  MlaSparseParams hp{};
  hp.batch = s.batch;
  hp.q_len = s.q_len;
  hp.num_heads = s.num_heads;
  hp.page_size = s.page_size;
  hp.topk = s.topk;
  hp.num_blocks = kv.table.num_pages;
  hp.q = q.get();
  hp.q_stride_head = kDim;
  hp.q_stride_token = H * kDim;
  hp.q_stride_batch = Q * H * kDim;
  hp.kv = kv.bytes.get();
  hp.kv_stride_block = page_bytes(s.page_size);
  hp.kv_stride_slot = kTokenBytes;
  hp.indices = idx.data();
  hp.indices_stride_token = s.topk;
  hp.indices_stride_batch = Q * s.topk;
  hp.out = out.get();
  hp.out_stride_head = kDim;
  hp.out_stride_token = H * kDim;
  hp.out_stride_batch = Q * H * kDim;
  hp.lse = lse.data();
  hp.lse_stride_head = 1;
  hp.lse_stride_token = H;
  hp.lse_stride_batch = Q * H;
  hp.softmax_scale = 1.f / std::sqrt(static_cast<float>(kDim));
  hp.kv_format = kMlaKvModel1;
  if (extra) {
    hp.extra_page_size = s.extra_page_size;
    hp.extra_num_blocks = extra->table.num_pages;
    hp.extra_topk = s.extra_topk;
    hp.extra_kv = extra->bytes.get();
    hp.extra_kv_stride_block = page_bytes(s.extra_page_size);
    hp.extra_indices = extra_idx.data();
    hp.extra_indices_stride_token = s.extra_topk;
    hp.extra_indices_stride_batch = Q * s.extra_topk;
  }
  // The run's arguments: the public API over the case's tensors (device copies on CUDA).
  CaseMemory mem(opt.cuda);
  auto cache_view = [&](const Cache& c) {
    return make_tensor(mem.place(c.bytes.get(), c.size), DType::kUINT8,
                       {c.table.num_pages, c.page, 1, kTokenBytes}, {page_bytes(c.page), kTokenBytes, kTokenBytes, 1},
                       device);
  };
  MlaSparseArgs args;
  args.q = make_tensor(mem.place(q.get(), q_elems * 2), DType::kBF16, {B, Q, H, kDim}, device);
  args.kv_cache = cache_view(kv);
  args.indices = make_tensor(mem.place(idx.data(), idx.size() * 4), DType::kINT32, {B, Q, s.topk}, device);
  void* out_ptr = mem.place(out.get(), q_elems * 2);
  args.out = make_tensor(out_ptr, DType::kBF16, {B, Q, H, kDim}, device);
  args.lse = make_tensor(mem.place(lse.data(), lse.size() * 4), DType::kFP32, {B, Q, H}, device);
  if (extra) {
    args.extra_kv_cache = cache_view(*extra);
    args.extra_indices = make_tensor(mem.place(extra_idx.data(), extra_idx.size() * 4), DType::kINT32,
                                     {B, Q, s.extra_topk}, device);
  }
  args.softmax_scale = hp.softmax_scale;
  void* ws = mem.workspace(plan.workspace_bytes);
  args.workspace = ws;
  args.workspace_bytes = plan.workspace_bytes;

  // FLOPs: 2 * h * (512 + 512) per (query row, selected key); bytes: 584 per selected token.
  long long keys = 0;
  for (std::int32_t id : idx) keys += id >= 0;
  for (std::int32_t id : extra_idx) keys += id >= 0;
  r.flops = 2.0 * H * (kDim + kDim) * static_cast<double>(keys);
  r.kv_bytes = static_cast<double>(keys) * kTokenBytes;
  r.total_bytes = r.kv_bytes + 4.0 * q_elems;

  bool scheduled = false;
  const bool reuse = opt.cuda && !opt.mla_schedule_every;
  if (opt.cuda) r.shape["schedule"] = reuse ? "once" : "every";
  time_and_check(
      opt, s.batch, out_ptr, out.get(), q_elems * 2,
      [&](void* stream) {
        MlaSparseArgs a = args;
        a.stream = stream;
        a.reuse_schedule = reuse && scheduled;
        mla_decode_sparse(plan, a);
        scheduled = true;
      },
      [&](const std::vector<int>& picked) {
        // The reference over the picked requests, each alone (batch 1 views into the host data).
        std::vector<std::uint16_t> ref(static_cast<std::size_t>(Q * H * kDim));
        ErrorAccumulator acc;
        for (int b : picked) {
          MlaSparseParams one = hp;
          one.batch = 1;
          one.q = static_cast<const std::uint16_t*>(hp.q) + b * hp.q_stride_batch;
          one.indices = hp.indices + b * hp.indices_stride_batch;
          if (extra) one.extra_indices = hp.extra_indices + b * hp.extra_indices_stride_batch;
          one.out = ref.data();
          one.lse = nullptr;
          cpu::mla_sparse_decode(one);
          acc.add(static_cast<const std::uint16_t*>(static_cast<void*>(out.get())) + b * hp.out_stride_batch,
                  ref.data(), DType::kBF16, ref.size());
        }
        return acc.finish();
      },
      r);
  check_mla_run(plan, ws, nullptr);
  r.shape["checked"] = opt.checked;
  return r;
}

}  // namespace deca::bench
