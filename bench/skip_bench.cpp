#include "skip_bench.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <ostream>

#include "api/gqa_prepare.hpp"
#include "cpu/element_io.hpp"
#include "gpu_timer.hpp"
#include "timing.hpp"

namespace deca::bench {
namespace {

constexpr int kHeavyKeys = 16;      // per (request, kv head): tokens 0-3 and 12 random ones
constexpr float kHeavyLogit = 20.f;  // the heavy keys' logit at the default softmax scale

// Writes the real value x (|x| <= 1: fill_random's range) into element `i` of a buffer of `dtype`
// whose codes read back at random_kv_scale(dtype).
void store_real(void* base, DType dtype, std::int64_t i, float x) {
  const float code = x / random_kv_scale(dtype);
  if (dtype == DType::kINT8) {
    static_cast<std::int8_t*>(base)[i] = static_cast<std::int8_t>(std::lround(code));
  } else {
    cpu::store_element(base, static_cast<int>(dtype), i, code);
  }
}

}  // namespace

void make_peaked(const GqaShape& s, KvLayout layout, const std::vector<int>& lengths, const PageTable& pages,
                 const std::int64_t (&cache_stride)[4], void* q, void* k, Rng& rng) {
  const int D = s.head_dim, group = s.num_q_heads / s.num_kv_heads;
  const bool nhd = layout == KvLayout::kNHD;
  const std::int64_t slot_stride = nhd ? cache_stride[1] : cache_stride[2];
  const std::int64_t head_stride = nhd ? cache_stride[2] : cache_stride[1];
  const float lift = kHeavyLogit / std::sqrt(static_cast<float>(D));  // q's share: logit = lift * D / sqrt(D)
  std::vector<float> sign(D);
  for (int b = 0; b < s.batch; ++b) {
    const int len = lengths[b];
    for (int kvh = 0; kvh < s.num_kv_heads; ++kvh) {
      for (float& x : sign) x = (rng.next() >> 63) ? 1.f : -1.f;
      for (int i = 0; i < s.q_len; ++i) {
        for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
          const std::int64_t row = ((static_cast<std::int64_t>(b) * s.q_len + i) * s.num_q_heads + h) * D;
          for (int d = 0; d < D; ++d) {
            const float x = cpu::load_element(q, static_cast<int>(DType::kBF16), row + d) + lift * sign[d];
            cpu::store_element(q, static_cast<int>(DType::kBF16), row + d, x);
          }
        }
      }
      for (int j = 0; j < std::min(kHeavyKeys, len); ++j) {
        const int t = j < 4 ? j : static_cast<int>(rng.below(static_cast<std::uint32_t>(len)));
        const std::int64_t page = pages.ids[static_cast<std::size_t>(b) * pages.max_pages + t / s.page_size];
        const std::int64_t base = page * cache_stride[0] + (t % s.page_size) * slot_stride + kvh * head_stride;
        for (int d = 0; d < D; ++d) store_real(k, s.kv_dtype, base + d, sign[d]);
      }
    }
  }
}

void measure_skip(const RunOptions& opt, const GqaPlan& skip_plan, const GqaDecodeArgs& args,
                  std::size_t out_bytes, int kv_elem_bytes, CaseResult& r) {
  GqaConfig exact_config = skip_plan.config;
  exact_config.skip_softmax_factor = 0.f;
  const GqaPlan exact_plan = plan_gqa_decode(exact_config);
  CaseMemory mem(opt.cuda);
  std::vector<unsigned char> skip_host(out_bytes), exact_host(out_bytes, 0xFF);
  GqaDecodeArgs exact = args;
  exact.out.data = mem.place(exact_host.data(), out_bytes);
  exact.workspace = mem.workspace(exact_plan.workspace_bytes);
  exact.workspace_bytes = exact.workspace ? exact_plan.workspace_bytes : 0;
  CaseResult exact_time;
  time_op(opt, [&](void* stream) {
    GqaDecodeArgs a = exact;
    a.stream = stream;
    gqa_decode(exact_plan, a);
  }, exact_time);

  // The skip kernel once more (the timed runs' output is the same), counting its V rows.
  unsigned long long counts[2] = {0, 0};
  GqaParams p = api::gqa_params(skip_plan, args, args.workspace);
  void* counts_dev = opt.cuda ? mem.place(counts, sizeof(counts)) : nullptr;
  p.skip_counts = static_cast<unsigned long long*>(counts_dev);
  api::dispatch_gqa_decode(skip_plan, p, nullptr);
  if (opt.cuda) {
    check_cuda(cudaDeviceSynchronize(), "skip-softmax count run");
    check_cuda(cudaMemcpy(counts, counts_dev, sizeof(counts), cudaMemcpyDeviceToHost), "counts (D2H)");
    check_cuda(cudaMemcpy(skip_host.data(), args.out.data, out_bytes, cudaMemcpyDeviceToHost), "out (D2H)");
    check_cuda(cudaMemcpy(exact_host.data(), exact.out.data, out_bytes, cudaMemcpyDeviceToHost), "out (D2H)");
  } else {
    std::memcpy(skip_host.data(), args.out.data, out_bytes);
  }
  ErrorAccumulator acc;
  acc.add(skip_host.data(), exact_host.data(), args.out.dtype, out_bytes / dtype_size(args.out.dtype));
  const ErrorStats e = acc.finish();

  const double row_bytes = static_cast<double>(skip_plan.config.head_dim) * kv_elem_bytes;
  nlohmann::json j = {{"factor", skip_plan.config.skip_softmax_factor},
                      {"exact_kernel", exact_plan.kernel_name},
                      {"exact_time_us", exact_time.time_us},
                      {"exact_time_us_graph", exact_time.time_us_graph ? nlohmann::json(*exact_time.time_us_graph)
                                                                        : nlohmann::json(nullptr)},
                      {"time_saved", exact_time.time_us > 0 ? 1.0 - r.time_us / exact_time.time_us : 0.0},
                      {"equivalent_kv_gbs", r.time_us > 0 ? r.kv_bytes / (r.time_us * 1e-6) / 1e9 : 0.0},
                      {"rel_rms_vs_exact", e.rel_rms},
                      {"max_abs_vs_exact", e.max_abs},
                      {"nonfinite", e.nonfinite}};
  if (opt.cuda) {
    j["v_bytes_read"] = static_cast<double>(counts[0]) * row_bytes;
    j["v_bytes_exact"] = static_cast<double>(counts[1]) * row_bytes;
    j["v_bytes_skipped"] = static_cast<double>(counts[1] - counts[0]) * row_bytes;
    j["v_skipped_share"] = counts[1] ? 1.0 - static_cast<double>(counts[0]) / static_cast<double>(counts[1]) : 0.0;
  }
  r.skip.update(j);
}

void print_skip_table(std::ostream& out, const std::vector<CaseResult>& results) {
  bool any = false;
  for (const CaseResult& r : results) any = any || r.skip.is_object();
  if (!any) return;
  out << "\nskip-softmax against the exact kernel on the same data (" << "--dist "
      << results.front().skip.value("dist", std::string("uniform")) << "):\n";
  out << std::left << std::setw(30) << "case" << std::right << std::setw(8) << "factor" << std::setw(12)
      << "exact us" << std::setw(11) << "skip us" << std::setw(8) << "saved" << std::setw(13) << "equiv GB/s"
      << std::setw(11) << "V skipped" << std::setw(14) << "V GB skipped" << std::setw(11) << "rel rms"
      << "\n";
  for (const CaseResult& r : results) {
    if (!r.skip.is_object()) continue;
    const nlohmann::json& j = r.skip;
    out << std::left << std::setw(30) << r.name << std::right << std::setw(8) << j.value("factor", 0.0)
        << std::fixed << std::setprecision(1) << std::setw(12) << j.value("exact_time_us", 0.0) << std::setw(11)
        << r.time_us << std::setw(7) << 100.0 * j.value("time_saved", 0.0) << "%" << std::setprecision(0)
        << std::setw(13) << j.value("equivalent_kv_gbs", 0.0) << std::setprecision(1);
    if (j.contains("v_skipped_share")) {
      out << std::setw(10) << 100.0 * j.value("v_skipped_share", 0.0) << "%" << std::setprecision(3)
          << std::setw(14) << j.value("v_bytes_skipped", 0.0) / 1e9;
    } else {
      out << std::setw(11) << "-" << std::setw(14) << "-";
    }
    out << std::scientific << std::setprecision(2) << std::setw(11) << j.value("rel_rms_vs_exact", 0.0) << "\n";
    out.unsetf(std::ios::floatfield);
  }
}

}  // namespace deca::bench
