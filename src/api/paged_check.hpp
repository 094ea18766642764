// Host checks of a paged cache's per-request lengths and table entries, shared by GQA decode
// (seq_lens, page_table, pages) and MLA dense decode (cache_seqlens, block_table, blocks): the
// rules are the same, only the names in the messages differ.
#pragma once

#include <cstdint>
#include <string_view>

#include "deca/tensor.hpp"

namespace deca::api {

// How one op names the pieces of its paged cache in messages.
struct PagedNames {
  const char* lens;   // the length tensor, e.g. "seq_lens"
  const char* table;  // the table tensor, e.g. "page_table"
  const char* unit;   // what a table entry names, e.g. "page"
  const char* pool;   // where the pool size comes from, e.g. "k_cache's num_pages"
};

// Request b of a host (CPU) length tensor and table: the length is >= 0, and unless it is 0 (an
// empty request) it is >= q_len, fits the table's columns and max_seq_len, and every table entry
// holding one of its keys names a unit of the pool. Returns the length.
std::int64_t expect_paged_request(std::string_view fn, const PagedNames& names,
                                  const TensorView& lens, const TensorView& table, std::int64_t b,
                                  std::int64_t q_len, int page_size, int max_seq_len,
                                  std::int64_t pool_size);

}  // namespace deca::api
