// Times one backend on one direction of a workload: workspace queried through the one selection
// point, allocated by the bench (so "extra memory" is exactly what the backend asked for), then
// measure() over the configured repeats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "flags.hpp"
#include "timing.hpp"
#include "workload.hpp"

namespace fa_bench {

struct PassResult {
  bool ran = false;
  std::string skipped;       // why it did not run (empty when it ran)
  bool extra_known = false;  // extra_bytes is valid (also when skipped for its size)
  size_t extra_bytes = 0;    // workspace bytes the backend asked for
  Timing timing;
  double gflops = 0.0;
};

Shape shape_of(const Options& o);

// Bytes of host memory a Workload of this shape holds (inputs and both paths' outputs), or an
// error when the sizes overflow; checked before allocating.
bool workload_bytes(const Shape& s, bool backward, uint64_t* bytes, std::string* error);

enum class Direction { kForward, kBackward };

// Runs `backend` on `path`'s outputs. A problem the backend does not take, or a workspace above
// max_workspace_bytes, gives a skipped result; a failure during a run sets *fatal.
PassResult time_pass(Workload& w, Direction dir, Path path, flashattn::Backend backend, const Options& o,
                     double flops, uint64_t max_workspace_bytes, std::string* fatal);

// "1.5 GiB", "320 KiB", "0 B".
std::string format_bytes(double bytes);

}  // namespace fa_bench
