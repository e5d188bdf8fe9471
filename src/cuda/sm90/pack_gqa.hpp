// Whether the Hopper forward runs a problem with pack-GQA (policy.hpp's pack_gqa: the rows of a
// kv head's query heads share tiles and one K/V read). The rule is the host's (forward.cu) and is
// exported for the tests, which check that the packed path is the one their shapes exercise.
#pragma once

#include "flashattn/flashattn.hpp"

namespace flashattn::detail {

// p's shape under the rule, for the instantiation that would run it (false when none is built).
bool cuda_sm90_forward_packs_gqa(const ForwardParams& p);

}  // namespace flashattn::detail
