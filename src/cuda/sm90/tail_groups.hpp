// How many tail groups the Hopper forward makes of a problem (tile_scheduler.cuh: the last query
// tiles whose rows fill one consumer's slice, three (batch, head)s to an item). The rule is the
// host's (forward.cu) and is exported for the tests, which check that their shapes take the path.
#pragma once

#include "flashattn/flashattn.hpp"

namespace flashattn::detail {

// p's tail groups for the instantiation that would run it (0: none, or no instantiation built).
int cuda_sm90_forward_tail_groups(const ForwardParams& p);

// The split tail's debt per tail group on the current device (tile_scheduler.cuh, tail_units_begin;
// 0: none, no split or no groups).
int cuda_sm90_forward_tail_group_debt(const ForwardParams& p);

}  // namespace flashattn::detail
