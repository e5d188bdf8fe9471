// Sweep mode: standard and flash forward over sequence lengths, CSV and a PNG of time and memory
// against n (standard's memory grows as n², flash's stays flat).
#pragma once

#include <cstdint>

#include "flags.hpp"

namespace fa_bench {

// Returns the process exit status.
int run_sweep(const Options& o, uint64_t seed);

}  // namespace fa_bench
