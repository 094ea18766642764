#include "data.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "deca/error.hpp"
#include "deca/quant.hpp"

namespace deca::bench {
namespace {

// 4096 fp8 codes of values evenly spread over [-448, 448): 12 random bits pick one, so the
// fill costs a table load per byte instead of a float conversion.
const std::array<std::uint8_t, 4096>& fp8_table() {
  static const std::array<std::uint8_t, 4096> table = [] {
    std::array<std::uint8_t, 4096> t{};
    for (int i = 0; i < 4096; ++i) t[i] = float_to_fp8e4m3(((i + 0.5f) / 2048.f - 1.f) * 448.f);
    return t;
  }();
  return table;
}

template <typename Fn>
void parallel_chunks(std::size_t count, Fn fn) {
  constexpr std::size_t kChunk = std::size_t{1} << 22;
  const std::size_t chunks = (count + kChunk - 1) / kChunk;
  const unsigned workers = static_cast<unsigned>(
      std::min<std::size_t>(chunks, std::max(1u, std::thread::hardware_concurrency())));
  if (workers <= 1) {
    for (std::size_t c = 0; c < chunks; ++c) fn(c, c * kChunk, std::min(count, (c + 1) * kChunk));
    return;
  }
  std::vector<std::thread> threads;
  for (unsigned w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      for (std::size_t c = w; c < chunks; c += workers)
        fn(c, c * kChunk, std::min(count, (c + 1) * kChunk));
    });
  }
  for (auto& t : threads) t.join();
}

double to_double(const void* p, DType dtype, std::size_t i) {
  switch (dtype) {
    case DType::kBF16: return bf16_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case DType::kFP16: return fp16_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case DType::kFP32: return static_cast<const float*>(p)[i];
    case DType::kFP8E4M3: return fp8e4m3_to_float(static_cast<const std::uint8_t*>(p)[i]);
    default: break;
  }
  throw Error(std::string("ErrorAccumulator::add: dtype: expected bf16, fp16, fp32 or fp8_e4m3, got ") +
              dtype_name(dtype));
}

}  // namespace

void fill_random(void* data, DType dtype, std::size_t count, std::uint64_t seed, float range) {
  if (dtype == DType::kFP8E4M3) fp8_table();  // build it before the threads race for it
  parallel_chunks(count, [&](std::size_t chunk, std::size_t begin, std::size_t end) {
    Rng rng(seed ^ (0xD1B54A32D192ED03ull * (chunk + 1)));
    switch (dtype) {
      case DType::kBF16: {
        auto* p = static_cast<std::uint16_t*>(data);
        for (std::size_t i = begin; i < end; ++i) {
          const float v = rng.symmetric() * range;
          std::uint32_t bits;
          std::memcpy(&bits, &v, 4);
          p[i] = static_cast<std::uint16_t>(bits >> 16);  // truncation: still uniform enough
        }
        break;
      }
      case DType::kFP16: {
        auto* p = static_cast<std::uint16_t*>(data);
        for (std::size_t i = begin; i < end; ++i) p[i] = float_to_fp16(rng.symmetric() * range);
        break;
      }
      case DType::kFP32: {
        auto* p = static_cast<float*>(data);
        for (std::size_t i = begin; i < end; ++i) p[i] = rng.symmetric() * range;
        break;
      }
      case DType::kFP8E4M3: {
        auto* p = static_cast<std::uint8_t*>(data);
        const auto& table = fp8_table();
        for (std::size_t i = begin; i < end;) {
          std::uint64_t bits = rng.next();
          for (int k = 0; k < 5 && i < end; ++k, ++i, bits >>= 12) p[i] = table[bits & 4095];
        }
        break;
      }
      case DType::kINT8: {
        auto* p = static_cast<std::int8_t*>(data);
        for (std::size_t i = begin; i < end; ++i)
          p[i] = static_cast<std::int8_t>(static_cast<int>(rng.below(255)) - 127);
        break;
      }
      default:
        throw Error(std::string("fill_random: dtype: expected bf16, fp16, fp32, fp8_e4m3 or "
                                "int8, got ") + dtype_name(dtype));
    }
  });
}

float random_kv_scale(DType dtype) {
  switch (dtype) {
    case DType::kFP8E4M3: return 1.f / 448.f;
    case DType::kINT8: return 1.f / 127.f;
    default: return 1.f;
  }
}

PageTable make_page_table(const std::vector<int>& lengths, int page_size, int max_pages,
                          Rng& rng) {
  PageTable t;
  t.max_pages = max_pages;
  for (int len : lengths) t.num_pages += (len + page_size - 1) / page_size;
  std::vector<std::int32_t> pool(std::max(t.num_pages, 1));
  std::iota(pool.begin(), pool.end(), 0);
  for (std::size_t i = pool.size(); i > 1; --i) std::swap(pool[i - 1], pool[rng.below(i)]);
  t.num_pages = static_cast<int>(pool.size());
  t.ids.assign(lengths.size() * static_cast<std::size_t>(max_pages), 0);
  std::size_t next = 0;
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    const int pages = (lengths[b] + page_size - 1) / page_size;
    for (int j = 0; j < pages; ++j) t.ids[b * max_pages + j] = pool[next++];
  }
  return t;
}

std::vector<int> sample_requests(int batch, int count) {
  std::vector<int> picked;
  if (count >= batch) {
    picked.resize(batch);
    std::iota(picked.begin(), picked.end(), 0);
    return picked;
  }
  for (int i = 0; i < count; ++i) {
    const int b = count == 1 ? 0 : static_cast<int>(static_cast<long long>(i) * (batch - 1) / (count - 1));
    if (picked.empty() || picked.back() != b) picked.push_back(b);
  }
  return picked;
}

void ErrorAccumulator::add(const void* got, const void* ref, DType dtype, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    const double g = to_double(got, dtype, i);
    const double r = to_double(ref, dtype, i);
    if (!std::isfinite(g) || !std::isfinite(r)) {
      ++nonfinite_;
      continue;
    }
    const double e = g - r;
    max_abs_ = std::max(max_abs_, std::abs(e));
    sum_sq_err_ += e * e;
    sum_sq_ref_ += r * r;
  }
}

ErrorStats ErrorAccumulator::finish() const {
  ErrorStats s;
  s.max_abs = max_abs_;
  s.rel_rms = sum_sq_ref_ > 0 ? std::sqrt(sum_sq_err_ / sum_sq_ref_) : std::sqrt(sum_sq_err_);
  s.nonfinite = nonfinite_;
  if (nonfinite_ > 0) s.max_abs = s.rel_rms = std::nan("");
  return s;
}

std::uint64_t run_seed() {
  if (const char* env = std::getenv("DECA_BENCH_SEED"); env && *env)
    return std::strtoull(env, nullptr, 0);
  std::random_device rd;
  const auto now = static_cast<std::uint64_t>(
      std::chrono::steady_clock::now().time_since_epoch().count());
  return (static_cast<std::uint64_t>(rd()) << 32 ^ rd()) ^ now;
}

}  // namespace deca::bench
