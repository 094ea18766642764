// Tile shape and shared-memory plan of the portable MLA decode kernel (kernels/mla/sm80/decode.cuh).
// Host-compilable: the backend reads kThreads and kSmemBytes.
#pragma once

namespace deca::mla::portable {

inline constexpr int kRows = 64;        // heads per CTA (num_heads padded inside)
inline constexpr int kKeys = 64;        // one scheduler block of indices per step
inline constexpr int kDimQK = 576;
inline constexpr int kDimV = 512;
inline constexpr int kWarps = 16;       // 4 row groups of 16 heads x 4 column groups
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kRowBytes = kDimQK * 2;      // bf16 row of Q or K: 72 chunks of 16 bytes
inline constexpr int kSStride = kKeys + 4;        // fp32 scores row, padded against conflicts
inline constexpr int kTokenBytes = 656;
inline constexpr int kNopeChunks = 32;            // 16 e4m3 values per 16-byte chunk
inline constexpr int kRopeChunks = 8;             // 8 bf16 values per 16-byte chunk
inline constexpr int kChunksPerToken = kNopeChunks + kRopeChunks;
// MODEL1 (kMlaKvModel1): d_qk 512 = d_v; a token's 576-byte row in its page is 28 chunks of 16
// e4m3 values (7 tiles of 64, one ue8m0 scale each, stored apart) then 8 chunks of bf16 RoPE. In
// the K tile its 448 + 64 values are dims 0..511 (chunks 0..63), so V is the tile's first 512
// dims as for V3.2, and QK^T runs 8 rounds of 64 dims instead of 9.
inline constexpr int kModel1DimQK = 512;
inline constexpr int kModel1NopeChunks = 28;
inline constexpr int kModel1Chunks = 36;

// Q and K rows are XOR-swizzled by 16-byte chunk (chunk ^ (row & 7)), not padded: padding would
// push the plan past the 163 KB an A100 CTA may have.
struct Smem {
  unsigned char q[kRows * kRowBytes];      // bf16 [64 heads][576]
  unsigned char k[kKeys * kRowBytes];      // bf16 [64 tokens][576], dequantized; V = dims 0..511
  float s[kRows * kSStride];               // raw logits of the current block
  long long token_offset[kKeys];           // byte offset of each token in kv, -1 = masked
  long long next_offset[kKeys];            // the same for the partition's next block (prefetch)
  // MODEL1 only (the offsets above are then the rows' addresses, either cache): bytes from a
  // token's row to its 8 bytes of scales, for the current and the next block.
  int scale_delta[kKeys];
  int next_scale_delta[kKeys];
};

inline constexpr int kSmemBytes = static_cast<int>(sizeof(Smem));
static_assert(kSmemBytes <= 166912, "the portable MLA kernel must fit an A100 CTA (163 KB)");
static_assert(kThreads * 5 == kKeys * kChunksPerToken, "gather: five chunks per thread");

}  // namespace deca::mla::portable
