// Argument checks shared by every backend. They run before any backend touches memory, so a bad
// call writes nothing. Messages name the argument and say what was expected.
#pragma once

#include "flashattn/flashattn.hpp"

namespace flashattn::detail {

Status validate_forward(const ForwardParams& p);
Status validate_backward(const BackwardParams& p);
Status validate_launch(const Launch& launch);

Status invalid(std::string message);
Status not_supported(std::string message);

}  // namespace flashattn::detail
