// The balanced schedule of the Hopper GQA kernel (Cfg::kBalanced, "_bal", DECA_GQA_SM90_BALANCED=1):
// a grid of as many CTAs as the SMs hold at once shares the batch's work evenly, whatever the
// lengths, instead of one CTA (or a fixed number of splits) per (request, kv head). Why it was
// built: with one warpgroup per CTA a tile's chain of dependent steps is long (~5000 cycles), so an
// SM streams at the memory's rate only with three CTAs on it, and a grid of units leaves SMs at two
// or one wherever it does not fill whole waves of three (q235-b64-4k: 256 units; l70-b128-2k: 2.6
// waves; split requests). Measured on the H200 it is slower on every fp8 row (docs/perf-notes.md),
// so it is a knob.
//
// The work is one line of cost positions (fewer than 2^31: the planner checks its bound, the
// products below are 64-bit): unit after unit (request-major, then kv head), each unit
// kUnitCost positions of fixed cost (its q, its epilogue) then one per 128-key tile. CTA c of the
// `ctas` taking part takes positions [c T / ctas, (c + 1) T / ctas). A unit cut between CTAs leaves
// one partial result (a piece) per CTA that touches it; the last piece to arrive merges them in CTA
// order, so equal lengths give equal bits. Plain integer functions: the kernel and the host tests
// (tests/plan/gqa_sm90_balance_test.cpp: every tile once, pieces and slots consistent) run the
// same lines.
#pragma once

#include "kernels/common/kv_kind.cuh"  // DECA_HD

namespace deca::gqa::sm90 {

constexpr int kUnitCost = 1;  // a unit's fixed cost, in tiles
constexpr int kMinShare = 4;  // the fewest positions one CTA takes: a small batch uses fewer CTAs

// Whether a batch of up to `max_batch` requests of up to `max_tiles` tiles each over `kv_heads` kv
// heads keeps its line below 2^31 positions (the planner's condition for this schedule).
DECA_HD constexpr bool line_fits(long long max_batch, long long kv_heads, long long max_tiles) {
  return max_batch * kv_heads * (kUnitCost + max_tiles) < (1LL << 31);
}

// CTAs that take part when the line has `total` positions and the grid `grid` CTAs: at most one
// per kMinShare positions, so no share is empty (every CTA between a unit's first and last piece
// holds a piece of it).
DECA_HD constexpr int active_ctas(int grid, int total) {
  const int by_work = (total + kMinShare - 1) / kMinShare;
  return by_work < grid ? (by_work > 0 ? by_work : 1) : grid;
}

// First position of CTA c's share.
DECA_HD constexpr int share_begin(int c, int ctas, int total) {
  return static_cast<int>(static_cast<long long>(c) * total / ctas);
}

// The CTA whose share holds position x (0 <= x < total): the last c with share_begin(c) <= x.
DECA_HD constexpr int cta_of(int x, int ctas, int total) {
  return static_cast<int>((static_cast<long long>(x + 1) * ctas - 1) / total);
}

// Tiles of a unit whose keys are [first, seq_len), `first` tile aligned.
DECA_HD constexpr int unit_tiles(int first, int seq_len, int tile) {
  return seq_len > first ? (seq_len - first + tile - 1) / tile : 0;
}

// The unit's tiles [lo, hi) inside the share [b, e), for a unit whose first position is `pos`.
DECA_HD constexpr int share_tile_lo(int pos, int tiles, int b) {
  const int i = b - pos - kUnitCost;
  return i < 0 ? 0 : (i > tiles ? tiles : i);
}
DECA_HD constexpr int share_tile_hi(int pos, int tiles, int e) {
  const int i = e - pos - kUnitCost;
  return i < 0 ? 0 : (i > tiles ? tiles : i);
}

// The CTAs holding pieces of a unit: first_cta .. first_cta + count - 1.
struct UnitPieces {
  int first_cta;
  int count;
};
DECA_HD constexpr UnitPieces unit_pieces(int pos, int tiles, int ctas, int total) {
  const int first = cta_of(pos, ctas, total);
  return UnitPieces{first, cta_of(pos + kUnitCost + tiles - 1, ctas, total) - first + 1};
}

// Workspace slot of CTA c's piece of the unit starting at `pos`: 2 c for the unit its share starts
// in, 2 c + 1 for the one it ends in (a share holds a partial unit only at its two ends).
DECA_HD constexpr int piece_slot(int c, int pos, int ctas, int total) {
  return 2 * c + (pos <= share_begin(c, ctas, total) ? 0 : 1);
}

// A unit on the line: its request and kv head, the keys it covers and where it starts.
struct Unit {
  int request;
  int kv_head;
  int seq_len;   // the request's length (causal positions)
  int first;     // first key (tile aligned; a window moves it up)
  int end;       // one past the last key
  int tiles;
  int pos;       // its first position on the line
};

// The unit after u (the next kv head, then the next request); `fill(u)` sets seq_len, first, end
// and tiles of a unit from its request. Past the last request the unit is left at pos = total.
template <class Fill>
DECA_HD void next_unit(Unit& u, int kv_heads, int batch, const Fill& fill) {
  u.pos += kUnitCost + u.tiles;
  if (++u.kv_head == kv_heads) {
    u.kv_head = 0;
    if (++u.request < batch) fill(u);
  }
}

// A walk over the tiles of one share, unit by unit (the kernel's loader; the compute loop walks
// the same units with next_unit).
struct TileCursor {
  Unit u;
  int i;      // tile of u
  int hi;     // end of u's tiles in the share
  bool done;  // past the share
};

// Moves c to the next tile of the share at or after its current (unit, tile).
template <class Fill>
DECA_HD void settle(TileCursor& c, int e, int kv_heads, int batch, const Fill& fill) {
  while (!c.done && c.i >= c.hi) {
    next_unit(c.u, kv_heads, batch, fill);
    if (c.u.pos >= e) {
      c.done = true;
    } else {
      c.i = 0;  // a later unit starts inside the share
      c.hi = share_tile_hi(c.u.pos, c.u.tiles, e);
    }
  }
}

template <class Fill>
DECA_HD TileCursor first_tile(const Unit& u, int b, int e, int kv_heads, int batch,
                              const Fill& fill) {
  TileCursor c{u, share_tile_lo(u.pos, u.tiles, b), share_tile_hi(u.pos, u.tiles, e), false};
  settle(c, e, kv_heads, batch, fill);
  return c;
}

template <class Fill>
DECA_HD void next_tile(TileCursor& c, int e, int kv_heads, int batch, const Fill& fill) {
  ++c.i;
  settle(c, e, kv_heads, batch, fill);
}

}  // namespace deca::gqa::sm90
