// The cp.async loader of the Hopper GQA kernels (decode.cuh, decode_rows.cuh): 128 threads copy
// a tile of K and of V (fp8: 128 tokens of 8 chunks; 16-bit: 128 tokens of 8 at head_dim 64, 64
// of 16 at 128, 32 of 32 at 256), 16-byte chunks, each where the 128-byte swizzle of the wgmma
// descriptors puts it. A row's C chunks are taken by L = min(C, 16) threads: thread (row tid / L
// + (128 / L) i, chunk tid % L + L j) of every tile; the row step 128 / L is 8 or 16, a multiple
// of the swizzle's 8 rows, so every row of a thread has the same swizzle phase. Page ids read a
// tile ahead, tokens in order (the fp8 V transpose puts them where each kernel's PV wants them).
// The cache strides of GqaParams count elements: the loader's byte strides are them times the
// element's size (layout.cuh cache_bytes).
#pragma once

#include "kernels/common/check_record.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/gqa/params.cuh"
#include "kernels/gqa/request.cuh"
#include "kernels/gqa/sm90/cta.cuh"
#include "kernels/gqa/sm90/layout.cuh"

namespace deca::gqa::sm90 {

template <class T>
struct TileLoader {
  static constexpr int kChunks = T::kHeadDim * T::kKvBytes / 16;  // 16-byte chunks per token row: 8, 16 or 32
  static constexpr int kLaneChunks = kChunks < 16 ? kChunks : 16;  // threads per row
  static constexpr int kColReps = kChunks / kLaneChunks;          // chunks per thread and row: 1 or 2
  static constexpr int kChunkShift = kLaneChunks == 8 ? 3 : 4;
  static constexpr int kRowStep = T::kThreads / kLaneChunks;  // loader rows between a thread's rows
  static constexpr int kRowLoads = T::kTile / kRowStep;       // rows per thread and tile
  // Chunk tid % L + L j of a row: 16 L j bytes on in the cache, and (16-bit, blocked128) 16 L j /
  // 128 column blocks of kTile x 128 B on in the tile.
  static constexpr unsigned kRepSrc = 16u * kLaneChunks;
  static constexpr unsigned kRepDst = kRepSrc / 128u * T::kTile * 128u;
  static_assert(kLaneChunks == 1 << kChunkShift && kRowStep % 8 == 0, "a thread's rows keep row % 8");
  static_assert(kRowLoads * kColReps == T::kLoadsPerThread, "loads per thread");
  // When a tile spans at most 32 whole pages (page size 4..128), lane j of every warp reads the
  // tile's page j and each row takes its id by shuffle when the tile is issued: one load per
  // thread and tile. Otherwise one of the 8 threads of a row reads the row's id (the portable
  // kernel's scheme, decode.cuh). Ids of pages past the unit's last key are never read (their
  // table entries may be anything): they stay -1, and so do rows past it.
  static constexpr bool kPagePerLane = T::kTile % T::kPageSize == 0 && T::kTile / T::kPageSize <= 32;
  // 16-bit caches whose pages hold whole tiles (a page a multiple of the tile, larger: 64-slot
  // pages at head_dim 256's 32-token tiles): every thread reads the tile's one page id, and its
  // rows are slots t0 % P + row of that page.
  static constexpr bool kTileInPage = T::k16 && T::kPageSize > T::kTile && T::kPageSize % T::kTile == 0;
  // Tiles start at multiples of 128 (every split boundary is tile aligned), so when the page size
  // divides 128 the slot of each of the thread's rows is the same in every tile.
  static constexpr bool kFixedSlots = T::kTile % T::kPageSize == 0;
  // Pages of at least a loader step (16 rows fp8, 8 rows 16-bit) that divide the tile: a thread's
  // rows fall in runs of kRowsPerPage per page, kThreadPages pages.
  // A tile inside one page (kTileInPage) is one run of all the thread's rows.
  static constexpr bool kPageRuns = (kPagePerLane && kFixedSlots && T::kPageSize >= kRowStep) || kTileInPage;
  static constexpr int kRowsPerPage = kTileInPage ? kRowLoads : (kPageRuns ? T::kPageSize / kRowStep : 1);
  static constexpr int kThreadPages = (kRowLoads + kRowsPerPage - 1) / kRowsPerPage;
  // Page-id slots of a thread per tile: one per lane, or one per row of the thread.
  static constexpr int kIdSlots = kPagePerLane || kTileInPage ? 1 : kRowLoads;

  const GqaParams& p;
  int* bad_item;  // checked mode: the ring's items whose page ids failed the range test
  unsigned chunk_ld, row0_ld, l;
  unsigned k_lane, v_lane;
  int pages_next[kIdSlots];

  __device__ __forceinline__ TileLoader(const GqaParams& params, int* bad, int tid)
      : p(params), bad_item(bad) {
    chunk_ld = static_cast<unsigned>(tid & (kLaneChunks - 1));
    row0_ld = static_cast<unsigned>(tid >> kChunkShift);
    l = static_cast<unsigned>(tid & 31);
    // The slot stride in bytes (bytes() below, written out: so fp8's machine code stays as it was).
    k_lane = row0_ld % T::kPageSize * static_cast<unsigned>(p.k_stride_slot * T::kKvBytes) + chunk_ld * 16;
    v_lane = row0_ld % T::kPageSize * static_cast<unsigned>(p.v_stride_slot * T::kKvBytes) + chunk_ld * 16;
  }

  // A cache stride of GqaParams (elements) in bytes (layout.cuh cache_bytes).
  static __device__ __forceinline__ long long bytes(long long stride) { return cache_bytes<T::kKvBytes>(stride); }

  __device__ __forceinline__ const int* page_row_of(int request) const {
    return p.page_table + request * p.page_table_stride;
  }
  __device__ __forceinline__ int checked_id(int id, int item, int request, unsigned page_index) const {
    if constexpr (T::kChecked) {
      if (static_cast<unsigned>(id) >= static_cast<unsigned>(p.num_pages)) {
        check_report(static_cast<CheckRecord*>(p.check), kCheckPageId, request, 0,
                     static_cast<int>(page_index), id, p.num_pages);
        bad_item[item % (T::kStages + 1)] = item;
        return -1;
      }
    }
    return id;
  }
  static __device__ __forceinline__ unsigned tile_t0(const TileCursor& c) {
    return static_cast<unsigned>(c.u.first + c.i * T::kTile);
  }

  // Slot s of cursor c's page ids: the page index it holds and whether c's keys need it.
  __device__ __forceinline__ bool slot_page(const TileCursor& c, int s, unsigned& page_index) const {
    const unsigned t0 = tile_t0(c);
    if constexpr (kTileInPage) {
      page_index = t0 / T::kPageSize;
      return !c.done;
    } else if constexpr (kPagePerLane) {
      page_index = t0 / T::kPageSize + l;
      return !c.done && l < T::kTile / T::kPageSize && t0 + l * T::kPageSize < static_cast<unsigned>(c.u.end);
    } else {
      const unsigned tok = t0 + row0_ld + kRowStep * s;
      page_index = tok / T::kPageSize;
      return !c.done && tok < static_cast<unsigned>(c.u.end) && chunk_ld == 0;
    }
  }

  // The page ids of cursor c's tile, the ring's tile `item`.
  __device__ __forceinline__ void fetch_pages(const TileCursor& c, int item) {
    const int* page_row = page_row_of(c.u.request);
#pragma unroll
    for (int s = 0; s < kIdSlots; ++s) {
      unsigned page_index;
      const bool needed = slot_page(c, s, page_index);
      pages_next[s] = needed ? checked_id(__ldg(page_row + page_index), item, c.u.request, page_index) : -1;
    }
  }

  // ---- The prologue: the first kAhead tiles' page ids in one dependent round trip, read before
  // the request's length is known where the split's keys can be foreseen ----
  // The unit's keys depend on the length only through the split's range (split_range): read as
  // if the request had the plan's promised maximum (p.max_seq_len), the ids of a split whose
  // first key comes out the same and whose keys end no earlier are the ones it needs, so
  // seq_len's read and theirs overlap. Entries past the row's max_pages are not read; nothing read
  // here is used unless start() finds the guess right. Checked mode reads after the length.
  template <int kAhead>
  __device__ __forceinline__ void read_guess(const Unit& guess, int (&ids)[kAhead][kIdSlots]) const {
    const int* page_row = page_row_of(guess.request);
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
      const TileCursor c{guess, a, guess.tiles, a >= guess.tiles || T::kChecked};
#pragma unroll
      for (int s = 0; s < kIdSlots; ++s) {
        unsigned page_index;
        const bool needed = slot_page(c, s, page_index) && page_index < static_cast<unsigned>(p.max_pages);
        ids[a][s] = needed ? __ldg(page_row + page_index) : -1;
      }
    }
  }

  // Issues the first kAhead tiles of cursor c (at its first tile, item 0) as kAhead issue_next
  // calls would, with every tile's page ids in hand first: the guessed ones (read_guess) when the
  // guess's keys start where c's do and end no earlier, else (and in checked mode) all of them
  // read now, at once.
  template <int kAhead>
  __device__ __forceinline__ void start(TileCursor& c, int& item, const CtaSmem& cs, const Unit& guess,
                                        const int (&guessed)[kAhead][kIdSlots]) {
    auto cursor = [&](int a) { return TileCursor{c.u, c.i + a, c.hi, c.i + a >= c.hi}; };
    int ids[kAhead][kIdSlots];
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
#pragma unroll
      for (int s = 0; s < kIdSlots; ++s) ids[a][s] = guessed[a][s];
    }
    // One branch for the CTA (hit is uniform), every read of it issued before any is used.
    if (T::kChecked || guess.first != c.u.first || guess.end < c.u.end) {
      const int* page_row = page_row_of(c.u.request);
#pragma unroll
      for (int a = 0; a < kAhead; ++a) {
#pragma unroll
        for (int s = 0; s < kIdSlots; ++s) {
          unsigned page_index;
          ids[a][s] = slot_page(cursor(a), s, page_index) ? __ldg(page_row + page_index) : -1;
        }
      }
    }
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
#pragma unroll
      for (int s = 0; s < kIdSlots; ++s) {
        unsigned page_index;
        const bool needed = slot_page(cursor(a), s, page_index);
        ids[a][s] = needed ? checked_id(ids[a][s], item + a, c.u.request, page_index) : -1;
      }
    }
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
#pragma unroll
      for (int s = 0; s < kIdSlots; ++s) pages_next[s] = ids[a][s];
      if (!c.done) issue_tile(c, cs.k_stage(item % T::kStages), cs.v_stage(item % T::kStages));
      ptx::cp_async_commit();
      ++c.i;
      c.done = c.i >= c.hi;
      ++item;
    }
    fetch_pages(c, item);
  }

  __device__ __forceinline__ int page_of_row(unsigned t0, unsigned end, int i) const {
    const unsigned row = row0_ld + kRowStep * i;
    if constexpr (kPagePerLane) {
      const int id = __shfl_sync(0xffffffffu, pages_next[0], static_cast<int>(row / T::kPageSize));
      return t0 + row < end ? id : -1;
    } else {
      return __shfl_sync(0xffffffffu, pages_next[i], static_cast<int>(l - chunk_ld));
    }
  }

  // Cursor c's tile (its page ids fetched by fetch_pages) into the K tile at shared address ks and
  // the V tile at vs, in token order: the thread's chunk of row row0 + step i at
  // swz128(row0 + step i, chunk) = swz128(row0, chunk) + 128 step i (step is a multiple of 8, so
  // row % 8 and the swizzle stay); 16-bit rows of 16 or 32 chunks in column blocks (blocked128),
  // the second chunk of a row (j = 1, head_dim 256) two blocks on.
  __device__ __forceinline__ void issue_tile(const TileCursor& c, unsigned ks, unsigned vs) const {
    issue_copies<true, true>(c, ks, vs);
  }

  // issue_tile's copies of K (kK) and of V (kV): the skip-softmax kernel (skip.cuh) issues a
  // tile's V apart from its K, once it knows the tile is kept.
  template <bool kK, bool kV>
  __device__ __forceinline__ void issue_copies(const TileCursor& c, unsigned ks, unsigned vs) const {
    unsigned dst0;
    if constexpr (kChunks == 8) {
      dst0 = swz128(static_cast<int>(row0_ld), static_cast<int>(chunk_ld * 16));
    } else {
      dst0 = blocked128(static_cast<int>(row0_ld), static_cast<int>(chunk_ld * 16), T::kTile);
    }
    auto dst = [&](int i) { return dst0 + 128u * kRowStep * i; };
    const unsigned t0 = tile_t0(c);
    const unsigned end = static_cast<unsigned>(c.u.end);
    const unsigned char* k_base = static_cast<const unsigned char*>(p.k_cache) +
                                  static_cast<long long>(c.u.kv_head) * bytes(p.k_stride_head);
    const unsigned char* v_base = static_cast<const unsigned char*>(p.v_cache) +
                                  static_cast<long long>(c.u.kv_head) * bytes(p.v_stride_head);
    const unsigned k_page_bytes = static_cast<unsigned>(bytes(p.k_stride_page));
    const unsigned k_slot_bytes = static_cast<unsigned>(bytes(p.k_stride_slot));
    const unsigned v_page_bytes = static_cast<unsigned>(bytes(p.v_stride_page));
    const unsigned v_slot_bytes = static_cast<unsigned>(bytes(p.v_stride_slot));
    if constexpr (kPageRuns) {
      // Rows row0 + step i of page (step i) / P: one id shuffle and one address per page the
      // thread touches (two for P = 64), each row an offset from it.
      const unsigned long long k_step = static_cast<unsigned long long>(kRowStep) * k_slot_bytes;
      const unsigned long long v_step = static_cast<unsigned long long>(kRowStep) * v_slot_bytes;
#pragma unroll
      for (int pg = 0; pg < kThreadPages; ++pg) {
        const int id = __shfl_sync(0xffffffffu, pages_next[0], pg);
        const unsigned long long upage = id >= 0 ? static_cast<unsigned>(id) : 0u;
        const unsigned char* kp = k_base + (upage * k_page_bytes + k_lane);
        const unsigned char* vp = v_base + (upage * v_page_bytes + v_lane);
        if constexpr (kTileInPage) {  // the tile's first slot in its page (every lane holds the id)
          kp += t0 % T::kPageSize * k_slot_bytes;
          vp += t0 % T::kPageSize * v_slot_bytes;
        }
#pragma unroll
        for (int r = 0; r < kRowsPerPage && pg * kRowsPerPage + r < kRowLoads; ++r) {
          const int i = pg * kRowsPerPage + r;
          const bool valid = id >= 0 && t0 + row0_ld + kRowStep * i < end;
#pragma unroll
          for (int j = 0; j < kColReps; ++j) {
            if constexpr (kK) ptx::cp_async_16(ks + dst(i) + kRepDst * j, kp + r * k_step + kRepSrc * j, valid);
            if constexpr (kV) ptx::cp_async_16(vs + dst(i) + kRepDst * j, vp + r * v_step + kRepSrc * j, valid);
          }
        }
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < kRowLoads; ++i) {
      const unsigned row = row0_ld + kRowStep * i;
      const int page = page_of_row(t0, end, i);
      const bool valid = page >= 0;
      const unsigned upage = valid ? static_cast<unsigned>(page) : 0u;
      unsigned k_in, v_in;  // byte offsets inside the page
      if constexpr (kFixedSlots && T::kPageSize >= kRowStep) {
        // (row0_ld + kRowStep i) % P = row0_ld % P + (kRowStep i) % P (both powers of two, one
        // divides the other): the second term is a constant.
        k_in = k_lane + (kRowStep * i) % T::kPageSize * k_slot_bytes;
        v_in = v_lane + (kRowStep * i) % T::kPageSize * v_slot_bytes;
      } else {
        const unsigned slot = kFixedSlots ? row % T::kPageSize : (t0 + row) % T::kPageSize;
        k_in = slot * k_slot_bytes + chunk_ld * 16;
        v_in = slot * v_slot_bytes + chunk_ld * 16;
      }
      const unsigned char* ksrc = k_base + (static_cast<unsigned long long>(upage) * k_page_bytes + k_in);
      const unsigned char* vsrc = v_base + (static_cast<unsigned long long>(upage) * v_page_bytes + v_in);
      if constexpr (kColReps == 1) {
        if constexpr (kK) ptx::cp_async_16(ks + dst(i), ksrc, valid);
        if constexpr (kV) ptx::cp_async_16(vs + dst(i), vsrc, valid);
      } else {
#pragma unroll
        for (int j = 0; j < kColReps; ++j) {
          if constexpr (kK) ptx::cp_async_16(ks + dst(i) + kRepDst * j, ksrc + kRepSrc * j, valid);
          if constexpr (kV) ptx::cp_async_16(vs + dst(i) + kRepDst * j, vsrc + kRepSrc * j, valid);
        }
      }
    }
  }

  // The kernels' pipeline step: issues cursor c's tile into ring stage item % kStages of cs (tile
  // g of the CTA goes to stage g % kStages; nothing past the CTA's last tile: an empty group keeps
  // the count), moves c and item on and fetches the next tile's page ids.
  __device__ __forceinline__ void issue_next(TileCursor& c, int& item, const CtaSmem& cs) {
    if (!c.done) {
      const int stage = item % T::kStages;
      issue_tile(c, cs.k_stage(stage), cs.v_stage(stage));
    }
    ptx::cp_async_commit();
    ++c.i;
    c.done = c.i >= c.hi;
    ++item;
    fetch_pages(c, item);
  }
};

}  // namespace deca::gqa::sm90
