#include "plan/mla_combine.hpp"

#include <vector>

#include "kernels/mla/schedule/schedule.cuh"

namespace deca::plan {

namespace {
// Past this many blocks a request is cut into as many pieces as partitions reach it whatever its
// length; the clamp keeps the schedule's integer costs far from overflow.
constexpr int kMaxBlocks = 1 << 16;
}  // namespace

int mla_uniform_pieces(int batch, int blocks, int num_parts) {
  if (batch < 1 || num_parts < 1) return 1;
  blocks = blocks < 0 ? 0 : (blocks > kMaxBlocks ? kMaxBlocks : blocks);
  std::vector<mla::SparsePart> parts(static_cast<std::size_t>(num_parts));
  std::vector<int> offsets(static_cast<std::size_t>(batch) + 1);
  const int slots = mla::schedule_requests(batch, mla::one_cache(nullptr, blocks * mla::kTopkBlock), num_parts,
                                           parts.data(), offsets.data());
  return slots / batch;
}

bool mla_split_combine(int max_batch, int blocks, int num_parts) {
  // The schedule makes at most batch + num_parts - 1 slots: with fewer partitions than this no
  // average reaches the threshold (and a large batch is answered without scheduling it).
  if (num_parts - 1 < (kMlaSplitCombinePieces - 1) * static_cast<long long>(max_batch)) return false;
  return mla_uniform_pieces(max_batch, blocks, num_parts) >= kMlaSplitCombinePieces;
}

}  // namespace deca::plan
