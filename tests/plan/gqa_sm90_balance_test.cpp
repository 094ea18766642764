// The Hopper GQA kernel's balanced schedule (kernels/gqa/sm90/balance.cuh) on the host: every CTA
// of a grid walks its share as the kernel does (the compute loop unit by unit, the loader tile by
// tile), and over ragged batches (empty requests, one long request, more CTAs than work) every
// tile is computed exactly once, the loader issues exactly the tiles the compute loop takes and in
// its order, each unit's pieces are the CTAs unit_pieces names, and the workspace slots are
// distinct and inside the plan's 2 x grid.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "kernels/gqa/sm90/balance.cuh"

namespace deca::gqa::sm90 {
namespace {

constexpr int kTileKeys = 128;

struct Batch {
  std::vector<int> lens;
  int heads;
  int grid;
};

// The unit whose positions hold `b` (the kernel finds it by a scan over its threads).
Unit unit_at(const Batch& x, int b) {
  int at = 0;
  for (int r = 0; r < static_cast<int>(x.lens.size()); ++r) {
    const int tiles = unit_tiles(0, x.lens[r], kTileKeys);
    const int cost = x.heads * (kUnitCost + tiles);
    if (b < at + cost) {
      const int h = (b - at) / (kUnitCost + tiles);
      return Unit{r, h, x.lens[r], 0, x.lens[r], tiles, at + h * (kUnitCost + tiles)};
    }
    at += cost;
  }
  ADD_FAILURE() << "position " << b << " past the line";
  return Unit{};
}

void check_schedule(const Batch& x) {
  const int batch = static_cast<int>(x.lens.size());
  auto fill = [&](Unit& u) {
    u.seq_len = x.lens[u.request];
    u.first = 0;
    u.end = u.seq_len;
    u.tiles = unit_tiles(0, u.seq_len, kTileKeys);
  };
  int total = 0;
  for (int len : x.lens) total += x.heads * (kUnitCost + unit_tiles(0, len, kTileKeys));
  const int ctas = active_ctas(x.grid, total);
  ASSERT_GE(ctas, 1);
  ASSERT_LE(ctas, x.grid);
  std::map<std::pair<int, int>, int> computed;             // (unit, tile) -> times
  std::map<int, std::vector<int>> holders;                 // unit -> CTAs holding a piece
  std::set<int> slots;
  for (int c = 0; c < ctas; ++c) {
    const int b = share_begin(c, ctas, total), e = share_begin(c + 1, ctas, total);
    ASSERT_LT(b, e) << "empty share " << c;
    EXPECT_EQ(cta_of(b, ctas, total), c);
    EXPECT_EQ(cta_of(e - 1, ctas, total), c);
    // The compute loop: unit by unit from the one b lies in, until a unit starts past the share.
    std::vector<std::pair<int, int>> order;
    Unit u = unit_at(x, b);
    const Unit first = u;
    for (;;) {
      const int unit = u.request * x.heads + u.kv_head;
      const int lo = share_tile_lo(u.pos, u.tiles, b), hi = share_tile_hi(u.pos, u.tiles, e);
      for (int i = lo; i < hi; ++i) {
        ++computed[{unit, i}];
        order.emplace_back(unit, i);
      }
      holders[unit].push_back(c);
      const UnitPieces up = unit_pieces(u.pos, u.tiles, ctas, total);
      const int index = c - up.first_cta;
      EXPECT_GE(index, 0);
      EXPECT_LT(index, up.count);
      const int slot = piece_slot(c, u.pos, ctas, total);
      if (up.count > 1) {
        EXPECT_TRUE(slots.insert(slot).second) << "slot " << slot << " twice";
        EXPECT_GE(slot, 0);
        EXPECT_LT(slot, 2 * x.grid);
        // What the merging CTA computes for piece `index` is this CTA's own slot.
        EXPECT_EQ(piece_slot(up.first_cta + index, u.pos, ctas, total), slot);
      }
      next_unit(u, x.heads, batch, fill);
      if (u.pos >= e) break;
    }
    // The loader: the same tiles in the same order.
    std::vector<std::pair<int, int>> issued;
    for (TileCursor t = first_tile(first, b, e, x.heads, batch, fill); !t.done;
         next_tile(t, e, x.heads, batch, fill)) {
      issued.emplace_back(t.u.request * x.heads + t.u.kv_head, t.i);
      ASSERT_LT(issued.size(), 1u << 20);
    }
    EXPECT_EQ(issued, order) << "CTA " << c;
  }
  for (int r = 0; r < batch; ++r) {
    for (int h = 0; h < x.heads; ++h) {
      const int unit = r * x.heads + h;
      const int tiles = unit_tiles(0, x.lens[r], kTileKeys);
      for (int i = 0; i < tiles; ++i) EXPECT_EQ((computed[{unit, i}]), 1) << unit << " tile " << i;
      // Its pieces: consecutive CTAs from unit_pieces' first, as many as it says.
      int pos = 0;
      for (int r2 = 0; r2 < r; ++r2) pos += x.heads * (kUnitCost + unit_tiles(0, x.lens[r2], kTileKeys));
      pos += h * (kUnitCost + tiles);
      const UnitPieces up = unit_pieces(pos, tiles, ctas, total);
      const std::vector<int>& hs = holders[unit];
      ASSERT_EQ(static_cast<int>(hs.size()), up.count) << "unit " << unit;
      for (int j = 0; j < up.count; ++j) EXPECT_EQ(hs[j], up.first_cta + j) << "unit " << unit;
    }
  }
  EXPECT_EQ(static_cast<int>(computed.size()), [&] {
    int n = 0;
    for (int len : x.lens) n += x.heads * unit_tiles(0, len, kTileKeys);
    return n;
  }());
}

TEST(GqaSm90Balance, ShareBoundariesAndOwners) {
  const int total = 1000, ctas = 396;
  int prev = -1;
  for (int c = 0; c <= ctas; ++c) {
    const int b = share_begin(c, ctas, total);
    EXPECT_GT(b, prev);  // no empty share when ctas <= total
    prev = b;
  }
  EXPECT_EQ(share_begin(ctas, ctas, total), total);
  for (int x = 0; x < total; ++x) {
    const int c = cta_of(x, ctas, total);
    EXPECT_LE(share_begin(c, ctas, total), x);
    EXPECT_GT(share_begin(c + 1, ctas, total), x);
  }
  // The line bounds the CTAs taking part (kMinShare positions each) and the grid does.
  EXPECT_EQ(active_ctas(396, 1), 1);
  EXPECT_EQ(active_ctas(396, 40), 10);
  EXPECT_EQ(active_ctas(396, 100000), 396);
  // A unit's tiles inside a share.
  EXPECT_EQ(share_tile_lo(10, 5, 0), 0);
  EXPECT_EQ(share_tile_lo(10, 5, 13), 2);   // positions 10 (fixed), 11.. tiles 0..
  EXPECT_EQ(share_tile_hi(10, 5, 13), 2);
  EXPECT_EQ(share_tile_hi(10, 5, 100), 5);
  EXPECT_EQ(share_tile_hi(10, 5, 10), 0);
  // Bound on the line (the planner's): 64 x 8 x 1025 fits, 4096 x 128 x 4097 does not.
  EXPECT_TRUE(line_fits(64, 8, 1024));
  EXPECT_FALSE(line_fits(4096, 128, 4096));
}

TEST(GqaSm90Balance, EveryTileOnceOverRaggedBatches) {
  // The benchmark shapes (l70-b99-4k, q235-b64-4k, l70-b1-128k, l70tp8-b32-8k) and edge cases.
  check_schedule({std::vector<int>(99, 4096), 8, 396});
  check_schedule({std::vector<int>(64, 4096), 4, 396});
  check_schedule({std::vector<int>(1, 131072), 8, 396});
  check_schedule({std::vector<int>(1, 131072), 1, 396});  // one unit over every CTA
  check_schedule({std::vector<int>(32, 8192), 1, 396});
  check_schedule({{0, 0, 0}, 8, 396});                       // nothing to compute
  check_schedule({{1}, 1, 396});                              // one tile
  check_schedule({{5000, 0, 1, 129, 0, 70000, 128}, 3, 396});
  check_schedule({{300, 9000, 1}, 2, 7});                     // a small grid
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 40; ++trial) {
    Batch x;
    x.heads = 1 + static_cast<int>(rng() % 8);
    x.grid = 1 + static_cast<int>(rng() % 400);
    const int batch = 1 + static_cast<int>(rng() % 40);
    for (int r = 0; r < batch; ++r) {
      const int kind = static_cast<int>(rng() % 4);
      x.lens.push_back(kind == 0 ? 0 : kind == 1 ? 1 + static_cast<int>(rng() % 300)
                                                 : static_cast<int>(rng() % 20000));
    }
    SCOPED_TRACE("trial " + std::to_string(trial));
    check_schedule(x);
  }
}

}  // namespace
}  // namespace deca::gqa::sm90
