// The CPU reference backend: the executable specification of every op (docs/semantics.md).
// Each function reads the same plain params struct the GPU kernels read, with host pointers,
// accumulates in double, and writes out (and lse when non-null). Arguments are assumed valid
// (src/api/ validates them first).
#pragma once

#include "kernels/gqa/params.cuh"
#include "kernels/mla/params.cuh"

namespace deca::cpu {

void gqa_decode(const GqaParams& p);
// The fused decode step (p.rope_style != 0): rotate q and k_new, append k_new / v_new to the
// cache, then gqa_decode over it (src/cpu/gqa_fused.cpp).
void gqa_decode_fused(const GqaParams& p);
void mla_dense_decode(const MlaDenseParams& p);
void mla_sparse_decode(const MlaSparseParams& p);
void combine(const CombineParams& p);

}  // namespace deca::cpu
