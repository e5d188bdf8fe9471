// Whether the Hopper forward runs a problem's last query tiles as shared tails (tile_scheduler.cuh:
// a one-slice last tile whose key tiles the three consumers share). The rule is the host's
// (forward.cu) and is exported for the tests, which check that their shapes take the path.
#pragma once

#include "flashattn/flashattn.hpp"

namespace flashattn::detail {

// p's shared tails for the instantiation that would run it (0: none, or no instantiation built).
int cuda_sm90_forward_shared_tails(const ForwardParams& p);

// The split tail's credit per shared tail, in percent of an item's key tiles, where no
// FLASHATTN_SM90_SHARED_TAIL_CREDIT (percent) overrides it: what a shared tail costs less than an item.
inline constexpr int kSharedTailCreditPercent = 50;

// The split tail's credit per shared tail on the current device, in key tiles (tile_scheduler.cuh,
// tail_units_begin; 0: none, no split or no shared tails).
int cuda_sm90_forward_shared_tail_credit(const ForwardParams& p);

}  // namespace flashattn::detail
