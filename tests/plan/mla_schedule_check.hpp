// The MLA decode scheduler's table tests' shared parts (tests/plan/mla_schedule_test.cpp, one
// cache; mla_schedule_model1_test.cpp, MODEL1's two): a host run of schedule_requests and the
// coverage invariants every schedule must keep.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "kernels/mla/schedule/schedule.cuh"

namespace deca::mla {

struct Schedule {
  std::vector<SparsePart> parts;
  std::vector<int> offsets;
  int slots = 0;
};

inline Schedule run(int batch, const TopkLists& lists, int num_parts) {
  Schedule s;
  s.parts.assign(num_parts, SparsePart{-7, -7, -7, -7, -7, -7, -7, -7});
  s.offsets.assign(batch + 1, -7);
  s.slots = schedule_requests(batch, lists, num_parts, s.parts.data(), s.offsets.data());
  return s;
}

// Every block of every request is processed exactly once, each piece has its own slot inside
// the request's range, pieces of a request take its slots in order, the counts the kernels read
// match, and an empty request still gets exactly one piece.
inline void expect_consistent(const Schedule& s, int batch, const TopkLists& lists, int num_parts) {
  ASSERT_EQ(s.offsets[0], 0);
  ASSERT_EQ(s.slots, s.offsets[batch]);
  EXPECT_LE(s.slots, batch + num_parts);
  std::vector<std::vector<int>> seen(batch);
  std::vector<std::vector<int>> slots(batch);
  for (int r = 0; r < batch; ++r) {
    seen[r].assign(request_blocks(lists, r), 0);
  }
  for (int i = 0; i < num_parts; ++i) {
    const SparsePart& p = s.parts[i];
    if (p.begin_req > p.end_req) {
      continue;
    }
    ASSERT_GE(p.begin_req, 0);
    ASSERT_LT(p.end_req, batch);
    EXPECT_EQ(p.begin_split_count, s.offsets[p.begin_req + 1] - s.offsets[p.begin_req]) << i;
    EXPECT_EQ(p.end_split_count, s.offsets[p.end_req + 1] - s.offsets[p.end_req]) << i;
    for (int r = p.begin_req; r <= p.end_req; ++r) {
      int first = 0, last = 0;
      piece_blocks(p, lists, r, first, last);
      ASSERT_LE(0, first);
      ASSERT_LE(first, last);
      ASSERT_LE(last, static_cast<int>(seen[r].size()));
      if (seen[r].empty()) EXPECT_EQ(first, last);
      else EXPECT_LT(first, last) << "partition " << i << " holds an empty piece of request " << r;
      for (int b = first; b < last; ++b) ++seen[r][b];
      slots[r].push_back(piece_slot(p, s.offsets.data(), r));
    }
  }
  for (int r = 0; r < batch; ++r) {
    for (std::size_t b = 0; b < seen[r].size(); ++b) {
      EXPECT_EQ(seen[r][b], 1) << "request " << r << " block " << b;
    }
    const int count = s.offsets[r + 1] - s.offsets[r];
    ASSERT_EQ(static_cast<int>(slots[r].size()), count) << "request " << r;
    ASSERT_GE(count, 1) << "request " << r;
    for (int j = 0; j < count; ++j) EXPECT_EQ(slots[r][j], s.offsets[r] + j) << "request " << r;
  }
}

}  // namespace deca::mla
