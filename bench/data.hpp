// Random benchmark data: fast parallel fills (never zeros: uniform values, fresh seed per run),
// shuffled page tables, and the error figures of --check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "deca/tensor.hpp"

namespace deca::bench {

// Host buffers of raw bytes; never zero-sized, so that an empty tensor still has a pointer.
using Bytes = std::unique_ptr<std::uint8_t[]>;
inline Bytes alloc_bytes(std::size_t n) {
  return Bytes(new std::uint8_t[n > 0 ? n : 1]);
}

// splitmix64: tiny, fast, and good enough to make data that no kernel can special-case.
struct Rng {
  std::uint64_t state;
  explicit Rng(std::uint64_t seed) : state(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n).
  std::uint32_t below(std::uint32_t n) {
    return static_cast<std::uint32_t>(((next() >> 32) * n) >> 32);
  }
  // Uniform in [-1, 1).
  float symmetric() { return static_cast<float>(static_cast<double>(next() >> 11) * 0x1p-52 - 1.0); }
};

// Fills `count` elements of `dtype` with values uniform in [-range, range) (for fp8: the
// stored codes of values uniform in [-448, 448), so that scale 1/448 gives real values in
// [-1, 1)). Splits the work over the host's cores. Supports bf16, fp16, fp8_e4m3, int8, fp32.
void fill_random(void* data, DType dtype, std::size_t count, std::uint64_t seed,
                 float range = 1.f);

// The scale that maps the codes fill_random writes for `dtype` back to [-1, 1).
float random_kv_scale(DType dtype);

// A page table for requests of the given lengths: request b gets ceil(len_b / page_size) pages,
// all ids distinct, drawn in shuffled order from a pool of exactly that many pages (a real
// cache is fragmented). Row-major [batch, max_pages]; entries past a request's pages are 0.
struct PageTable {
  std::vector<std::int32_t> ids;
  int max_pages = 0;
  int num_pages = 0;
};
PageTable make_page_table(const std::vector<int>& lengths, int page_size, int max_pages,
                          Rng& rng);

// Indices of `count` requests spread evenly over [0, batch) (all of them when count >= batch).
std::vector<int> sample_requests(int batch, int count);

struct ErrorStats {
  double max_abs = 0;
  double rel_rms = 0;  // sqrt(sum (got - ref)^2 / sum ref^2)
  std::size_t nonfinite = 0;
};
// Accumulates element pairs (got, ref) of `dtype` into running sums; finish() gives the figures.
class ErrorAccumulator {
 public:
  void add(const void* got, const void* ref, DType dtype, std::size_t count);
  ErrorStats finish() const;

 private:
  double max_abs_ = 0, sum_sq_err_ = 0, sum_sq_ref_ = 0;
  std::size_t nonfinite_ = 0;
};

// A fresh seed per run (or DECA_BENCH_SEED from the environment, to replay one).
std::uint64_t run_seed();

}  // namespace deca::bench
