// The CPU backends' worker pool: one per process, started on first use with one worker per
// hardware thread. parallel_for hands out task indices dynamically; every task writes only its own
// outputs, so results never depend on which worker ran what. A caller that finds the pool busy
// (another thread is inside parallel_for) runs its tasks itself rather than waiting.
#pragma once

#include <cstdint>
#include <functional>

namespace flashattn::detail {

// Number of hardware threads (at least 1).
int hardware_threads();

// Resolves Launch::num_threads (0 = all) to the number of workers a call will use.
int resolve_threads(int requested);

// Runs fn(task, worker) for task in [0, num_tasks) on up to `threads` workers;
// worker is in [0, threads) and indexes per-worker scratch. Returns when all tasks are done.
void parallel_for(int64_t num_tasks, int threads, const std::function<void(int64_t task, int worker)>& fn);

}  // namespace flashattn::detail
