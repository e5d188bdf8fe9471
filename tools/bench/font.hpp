// A 5x7 bitmap font for printable ASCII (32..126): each glyph is seven rows, top first, and bit 4
// of a row is its leftmost pixel. Characters outside the range draw as '?'.
#pragma once

#include <array>
#include <cstdint>

namespace fa_bench {

using Glyph = std::array<uint8_t, 7>;
const Glyph& glyph(char c);

}  // namespace fa_bench
