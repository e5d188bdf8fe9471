// Argument checks shared by every backend. They run before any backend touches memory, so a bad
// call writes nothing. Messages name the argument and say what was expected.
#pragma once

#include "flashattn/flashattn.hpp"

namespace flashattn::detail {

// host_cu_seqlens: cu_seqlens are host memory and their contents are checked; GPU backends take them
// in device memory, where checking would need a synchronising copy, so their contents are the
// caller's promise there.
Status validate_forward(const ForwardParams& p, bool host_cu_seqlens = true);
Status validate_backward(const BackwardParams& p, bool host_cu_seqlens = true);
Status validate_launch(const Launch& launch);

Status invalid(std::string message);
Status not_supported(std::string message);

}  // namespace flashattn::detail
