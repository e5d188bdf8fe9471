// The GPU mode of flashattn-bench (--device cuda; compiled in CUDA builds only): the flash forward
// (and backward) of one shape on the current CUDA device through the public API with the --kernel
// backend, timed with CUDA events over inputs rotated so that L2 does not serve them, checked
// against the double reference like the CPU mode. --help documents what is measured.
#pragma once

#include <cstdint>

#include "flags.hpp"

namespace fa_bench {

// Returns the process exit status (kExitOk, kExitRunFailed, kExitUsage).
int run_gpu(const Options& o, uint64_t seed);

}  // namespace fa_bench
