// Which combine an MLA decode plan launches: a pure function of the plan's maxima (the longest
// request, max_batch) and its partition count, table-tested in tests/plan/mla_combine_test.cpp.
// Graph-stable: a plan fixes its combine, whatever the lengths of a run.
//
// Both combines merge a request's pieces (kernels/mla/combine/combine.cuh) with the same
// operations in the same order, so either gives the same bytes; they differ in how the work is
// spread. The warp-per-row combine gives each (request, token, head) row one warp that walks the
// pieces one dependent L2 round trip after another, 8 rows to a CTA. The split combine gives each
// row a CTA of 4 warps, each 128 of the 512 value dims with 16 pieces' loads in flight: it cuts a
// row's chain of round trips 16-fold but launches 8 times the CTAs (with 4 times the warps) and
// loads a full round of 16 pieces even for a row of 2. So it pays where a few requests are each
// cut into many pieces, and costs where many requests are cut into a few (or none: a dense run
// launches the combine whatever the lengths, and every CTA of an uncut request returns at once).
// The H200 figures behind the threshold are in docs/perf-notes-mla.md ("The split combine").
#pragma once

namespace deca::plan {

// Pieces a row must average for the split combine: one round of its loads in flight.
inline constexpr int kMlaSplitCombinePieces = 16;

// The average pieces per request of the schedule (kernels/mla/schedule/schedule.cuh) of `batch`
// requests of `blocks` blocks of 64 tokens (or indices) each on `num_parts` partitions: its slots
// over the batch, rounded down. At least 1 for batch >= 1. Blocks past 65536 count as 65536 (the
// pieces no longer change), and batch * 65541 must fit an int (batch <= 32000).
int mla_uniform_pieces(int batch, int blocks, int num_parts);

// Whether a plan runs the split combine: when the schedule of max_batch requests of the plan's
// longest length (`blocks` blocks each) averages at least kMlaSplitCombinePieces pieces a
// request. A run of fewer or shorter requests keeps its plan's combine.
bool mla_split_combine(int max_batch, int blocks, int num_parts);

}  // namespace deca::plan
