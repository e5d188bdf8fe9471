// Pieces the flash backward (backward.cpp) and the standard backward (standard_backward.cpp)
// share: fp32 staging of strided storage-dtype rows, D = rowsum(dO ∘ O), and the element-wise
// score -> P step with every score modifier.
#pragma once

#include <cstdint>

#include "core/problem.hpp"
#include "cpu/backward_kernels.hpp"

namespace flashattn::detail {

// dst[r, c] = src row r (element offsets row_offset(r)), c < dim, as fp32; dst row stride ld.
template <class RowOffset>
void load_rows_f32(const BackwardKernels& kern, const void* src, DType t, int64_t rows, int64_t dim,
                   RowOffset row_offset, float* dst, int64_t ld) {
  const int64_t esz = static_cast<int64_t>(dtype_size(t));
  for (int64_t r = 0; r < rows; ++r)
    kern.widen(static_cast<const char*>(src) + row_offset(r) * esz, t, dim, dst + r * ld);
}

// Stores src[r, c] (row stride ld) into a strided storage-dtype tensor, rounding to nearest even.
template <class RowOffset>
void store_rows(const BackwardKernels& kern, const float* src, int64_t ld, int64_t rows, int64_t dim, void* dst,
                DType t, RowOffset row_offset) {
  const int64_t esz = static_cast<int64_t>(dtype_size(t));
  for (int64_t r = 0; r < rows; ++r) kern.narrow(src + r * ld, dim, t, static_cast<char*>(dst) + row_offset(r) * esz);
}

// D_i = Σ_c dO[i, c] · O[i, c] for query rows i0 .. i0 + rows of sequence s, head h (double sum,
// rounded once). row_buf holds 2 · head_dim_v floats.
void compute_d_rows(const BackwardKernels& kern, const BackwardParams& p, const Seq& s, int64_t h, int64_t i0,
                    int64_t rows, float* d, float* row_buf);

// The tile of scores for query rows [i0, i0 + rows) x keys [j0, j0 + cols) becomes P, in place:
// x holds scale-free dot products q·k on entry (row stride ld). lse2[r] is row r's LSE times
// log2(e), or +inf for a row with LSE = -inf (which then gets P = 0). When softcap is on, g gets
// the chain-rule factor 1 - tanh² of each element (row stride ld); otherwise g is unused.
// `fast` says the tile is inside the causal/window band and has no score modifiers.
void scores_to_p(const BackwardKernels& kern, const AttentionParams& p, const Seq& s, const ScoreMods& mods,
                 float scale, bool fast, int64_t i0, int64_t rows, int64_t j0, int64_t cols, float* x,
                 int64_t ld, const float* lse2, float* g);

// dS = P ∘ (dP - D) · scale (· g with softcap) in place of dP; rows with LSE = -inf get 0.
void p_to_ds(const BackwardKernels& kern, bool softcap, int64_t rows, int64_t cols, const float* pm, float* dp,
             int64_t ld, const float* d, const float* lse2, const float* g, float scale);

}  // namespace flashattn::detail
