// The portable GQA kernel's loads (decode.cuh): all 128 threads stream the K and V tiles of the
// CTA's work items with cp.async through a kStages-deep ring in shared memory (8-bit caches stay
// 8-bit there: twice the tokens per stage). Each thread copies fixed (row, 16-byte chunk) slots
// of every tile; a tile's page ids are read a ring step before its copies are issued.
#pragma once

#include "kernels/common/check_record.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/gqa/params.cuh"
#include "kernels/gqa/request.cuh"
#include "kernels/gqa/sm80/cta.cuh"
#include "kernels/gqa/sm80/traits.cuh"

namespace deca::gqa {

// The ring: stage s of K, then stage s of V after all K stages.
template <class T>
struct SharedStorage {
  static __device__ __forceinline__ unsigned k_stage(unsigned base, int s) {
    return base + s * T::kStageBytes;
  }
  static __device__ __forceinline__ unsigned v_stage(unsigned base, int s) {
    return base + (T::kStages + s) * T::kStageBytes;
  }
};

template <class T>
struct KvLoader {
  static constexpr bool kEvenLoads = T::kThreads % T::kChunksPerRow == 0;
  static constexpr unsigned kRowStep = T::kThreads / T::kChunksPerRow;
  // The kChunksPerRow threads that copy one row sit side by side in a warp when that count divides
  // 32: one of them reads the page id and passes it on, an eighth (fp8) or a sixteenth (bf16) of
  // the table reads. The hand-over waits for the read, so it happens when the tile is issued, an
  // iteration after the read (a shuffle right after the load stalls every tile on it).
  static constexpr bool kShareRows = kEvenLoads && (32 % T::kChunksPerRow == 0);

  const GqaParams& p;
  const CtaCoords<T>& cta;
  const KeyRange& range;
  const WorkItems<T>& items;
  int* bad_item;
  int tid;
  int lane;
  unsigned smem_base;
  const unsigned char* k_base;
  const unsigned char* v_base;
  const int* page_rows;  // the request's first beam's page_table row
  // Byte strides fit 32 bits (the backend checks before launch); only page * page_bytes needs 64
  // bits, which one wide multiply-add gives. Unsigned token math: / and % by the constant page
  // size are shifts and masks for powers of two.
  unsigned k_page_bytes, k_slot_bytes, v_page_bytes, v_slot_bytes;
  // This thread's slots in every tile: rows row0_ld + i * kRowStep, one 16-byte chunk each.
  unsigned chunk_ld, row0_ld;
  // The next tile's page ids, by slot (-1: none): an array of the kernel's (gqa_decode_kernel says
  // why).
  int (&pages_next)[T::kLoadsPerThread];

  __device__ __forceinline__ KvLoader(const GqaParams& params, const CtaCoords<T>& c, const KeyRange& r,
                                      const WorkItems<T>& w, int* bad, const Lane& ln, unsigned base,
                                      int (&pages)[T::kLoadsPerThread])
      : p(params), cta(c), range(r), items(w), bad_item(bad), tid(ln.tid), lane(ln.lane), smem_base(base),
        pages_next(pages) {
    k_base = static_cast<const unsigned char*>(p.k_cache) +
             static_cast<long long>(cta.kv_head) * p.k_stride_head * T::kKvBytes;
    v_base = static_cast<const unsigned char*>(p.v_cache) +
             static_cast<long long>(cta.kv_head) * p.v_stride_head * T::kKvBytes;
    page_rows = p.page_table + cta.batch * p.page_table_stride;
    k_page_bytes = static_cast<unsigned>(p.k_stride_page * T::kKvBytes);
    k_slot_bytes = static_cast<unsigned>(p.k_stride_slot * T::kKvBytes);
    v_page_bytes = static_cast<unsigned>(p.v_stride_page * T::kKvBytes);
    v_slot_bytes = static_cast<unsigned>(p.v_stride_slot * T::kKvBytes);
    chunk_ld = static_cast<unsigned>(tid % T::kChunksPerRow);
    row0_ld = static_cast<unsigned>(tid / T::kChunksPerRow);
  }

  __device__ __forceinline__ unsigned load_row(int i) const {
    if constexpr (kEvenLoads) return row0_ld + i * kRowStep;
    return static_cast<unsigned>((tid + i * T::kThreads) / T::kChunksPerRow);
  }
  __device__ __forceinline__ unsigned load_chunk(int i) const {
    if constexpr (kEvenLoads) return chunk_ld;
    return static_cast<unsigned>((tid + i * T::kThreads) % T::kChunksPerRow);
  }

  // The page id of token `tok` in `page_row` (beam `beam`'s row, -1: all beams'). Checked mode: an
  // id outside [0, num_pages) is recorded, flagged for the item's masking and replaced by -1 (the
  // loads then zero-fill), so it is never dereferenced: one compare and a not-taken branch.
  __device__ __forceinline__ int read_page(const int* page_row, unsigned tok, int item, int beam) const {
    const int id = __ldg(page_row + tok / T::kPageSize);
    if constexpr (T::kChecked) {
      if (static_cast<unsigned>(id) >= static_cast<unsigned>(p.num_pages)) {
        check_report(static_cast<CheckRecord*>(p.check), kCheckPageId, cta.batch + (beam > 0 ? beam : 0),
                     0, static_cast<int>(tok / T::kPageSize), id, p.num_pages);
        bad_item[item % T::kBadItemSlots] = item;
        return -1;
      }
    }
    return id;
  }

  // The page ids of work item `item`'s tile (none past the last item).
  __device__ __forceinline__ void fetch_pages(int item) {
    const bool tile_ok = item < items.num_items;
    const int tile = items.tile(item);
    const int beam = items.beam(item);
    const unsigned t0 = static_cast<unsigned>(range.begin + tile * T::kTile);
    const int* page_row = page_rows + (beam > 0 ? beam * p.page_table_stride : 0);
    int end = range.end;
    if (T::kBeamWidth > 1 && beam >= 0) {
      const int own = load_seq_len<T>(p, cta.batch + beam);
      end = own < end ? own : end;
    }
#pragma unroll
    for (int i = 0; i < T::kLoadsPerThread; ++i) {
      const unsigned row = load_row(i);
      const unsigned tok = t0 + row;
      // Pages past the request's last key are never read: their table entries may be anything.
      const bool needed = row < T::kTile && tile_ok && tok < static_cast<unsigned>(end);
      if constexpr (kShareRows) {
        pages_next[i] = (needed && chunk_ld == 0) ? read_page(page_row, tok, item, beam) : -1;
      } else {
        pages_next[i] = needed ? read_page(page_row, tok, item, beam) : -1;
      }
    }
  }

  // Item `item`'s K and V tiles (their page ids fetched) into ring stage `stage`, as cp.async
  // copies (a missing page's rows zero-filled).
  __device__ __forceinline__ void issue_tile(int item, int stage) const {
    const unsigned t0 = static_cast<unsigned>(range.begin + items.tile(item) * T::kTile);
    const unsigned ks = SharedStorage<T>::k_stage(smem_base, stage);
    const unsigned vs = SharedStorage<T>::v_stage(smem_base, stage);
    issue_rows<true, true>(t0, ks, vs, 0u);
  }

  // The copies of issue_tile into the tiles at `ks` / `vs`: K when kK, V when kV. V alone (the
  // skip-softmax kernel, skip.cuh) copies only the rows of the warp slices (row / kWarpTokens)
  // whose bit `v_slices` sets.
  template <bool kK, bool kV>
  __device__ __forceinline__ void issue_copies(int item, unsigned ks, unsigned vs, unsigned v_slices) const {
    issue_rows<kK, kV>(static_cast<unsigned>(range.begin + items.tile(item) * T::kTile), ks, vs, v_slices);
  }

  // The copies of the tile whose first key is t0.
  template <bool kK, bool kV>
  __device__ __forceinline__ void issue_rows(unsigned t0, unsigned ks, unsigned vs, unsigned v_slices) const {
#pragma unroll
    for (int i = 0; i < T::kLoadsPerThread; ++i) {
      const unsigned row = load_row(i);
      const unsigned chunk = load_chunk(i);
      int page = pages_next[i];
      if constexpr (kShareRows) page = __shfl_sync(0xffffffffu, page, lane - static_cast<int>(chunk_ld));
      if (T::kTile * T::kChunksPerRow % T::kThreads == 0 || row < T::kTile) {
        const bool valid = page >= 0;
        const unsigned slot = (t0 + row) % T::kPageSize;
        const unsigned upage = valid ? static_cast<unsigned>(page) : 0u;
        const unsigned char* ksrc = k_base + (static_cast<unsigned long long>(upage) * k_page_bytes +
                                              (slot * k_slot_bytes + chunk * 16));
        const unsigned char* vsrc = v_base + (static_cast<unsigned long long>(upage) * v_page_bytes +
                                              (slot * v_slot_bytes + chunk * 16));
        const unsigned off = row * T::kRowStride + chunk * 16;
        if constexpr (kK) ptx::cp_async_16(ks + off, ksrc, valid);
        if constexpr (kV && !kK) {
          if ((v_slices >> (row / T::kWarpTokens)) & 1u) ptx::cp_async_16(vs + off, vsrc, valid);
        } else if constexpr (kV) {
          ptx::cp_async_16(vs + off, vsrc, valid);
        }
      }
    }
  }
};

}  // namespace deca::gqa
