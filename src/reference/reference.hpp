// The double-precision reference: textbook attention, the oracle of every test and of the
// benchmark's spot checks. reference_forward / reference_backward (declared in core/backends.hpp)
// run whole problems; reference_forward_row gives one query row without rounding its result.
#pragma once

#include <cstdint>

#include "flashattn/flashattn.hpp"

namespace flashattn::detail {

// Forward of query row i of sequence b, query head h, in double, before rounding to the storage
// dtype: o_row [head_dim_v] and *lse (natural log). reference_forward stores exactly these values
// (rounded to the storage dtype and fp32). A row that sees no key gets o_row = 0, *lse = -inf.
// Preconditions: p passes validate_forward's checks of AttentionParams, b < batch, h < heads_q,
// i < seqlen_q of sequence b. Reads the keys and values of sequence b once per call.
void reference_forward_row(const AttentionParams& p, int64_t b, int64_t h, int64_t i, double* o_row, double* lse);

}  // namespace flashattn::detail
