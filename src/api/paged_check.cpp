#include "api/paged_check.hpp"

#include <string>

#include "api/check.hpp"

namespace deca::api {

namespace {

std::string s(std::int64_t v) { return float_string(v); }

}  // namespace

std::int64_t expect_paged_request(std::string_view fn, const PagedNames& n,
                                  const TensorView& lens, const TensorView& table, std::int64_t b,
                                  std::int64_t q_len, int page_size, int max_seq_len,
                                  std::int64_t pool_size) {
  // Names for messages are built only when one is thrown: this runs once per request per call.
  const auto name = [&] { return std::string(n.lens) + "[" + s(b) + "]"; };
  const char* unit = n.unit;
  const std::int64_t max_units = table.shape[1];
  const std::int64_t capacity = max_units * page_size;
  const std::int64_t len = load_i32(lens, b);
  if (len < 0) fail(fn, name(), ">= 0", s(len));
  // 0 marks an inactive (padding) request: it outputs zeros, like any row with no visible key.
  if (len == 0) return len;
  if (len < q_len) {
    fail(fn, name(),
         ">= q_len (" + s(q_len) + "): the new tokens are already in the cache; 0 = empty request",
         s(len));
  }
  if (len > capacity) {
    fail(fn, name(),
         "<= max_" + std::string(unit) + "s * page_size = " + s(max_units) + " * " +
             s(page_size) + " = " + s(capacity) + " (the " + unit + "s " + n.table +
             " provides)",
         s(len));
  }
  if (len > max_seq_len) {
    fail(fn, name(), "<= plan.config.max_seq_len (" + s(max_seq_len) + ")", s(len));
  }
  // Every unit holding one of the request's keys is checked, even those before a sliding
  // window: the reference gathers them all, and a stale id there would be read.
  for (std::int64_t j = 0; j <= (len - 1) / page_size; ++j) {
    const std::int64_t id = load_i32(table, b, j);
    if (id < 0 || id >= pool_size) {
      fail(fn, std::string(n.table) + "[" + s(b) + "][" + s(j) + "]",
           "a " + std::string(unit) + " id in [0, " + s(pool_size) + ") (" + n.pool + "; " +
               name() + " = " + s(len) + " uses this entry)",
           s(id));
    }
  }
  return len;
}

}  // namespace deca::api
