// The CPU backends' worker pool: one per process, started on first use with one worker per
// hardware thread. parallel_for hands out task indices dynamically; every task writes only its own
// outputs, so results never depend on which worker ran what. A caller that finds the pool busy
// (another thread is inside parallel_for) runs its tasks itself rather than waiting.
#pragma once

#include <cstdint>
#include <memory>
#include <type_traits>

namespace flashattn::detail {

// Number of hardware threads (at least 1).
int hardware_threads();

// Resolves Launch::num_threads (0 = all) to the number of workers a call will use.
int resolve_threads(int requested);

// Runs fn(ctx, task, worker) for task in [0, num_tasks) on up to `threads` workers;
// worker is in [0, threads) and indexes per-worker scratch. Returns when all tasks are done.
using TaskFn = void (*)(void* ctx, int64_t task, int worker);
void parallel_for_fn(int64_t num_tasks, int threads, TaskFn fn, void* ctx);

// The same for any callable fn(task, worker). A plain function pointer crosses into the pool, no
// std::function: code built for one ISA (*.avx512.cpp) then shares no library template
// instantiations with the baseline build (core/isa_namespace.hpp).
template <class F>
void parallel_for(int64_t num_tasks, int threads, F&& fn) {
  using Fn = std::remove_reference_t<F>;
  parallel_for_fn(
      num_tasks, threads, [](void* ctx, int64_t task, int worker) { (*static_cast<Fn*>(ctx))(task, worker); },
      const_cast<void*>(static_cast<const void*>(std::addressof(fn))));
}

}  // namespace flashattn::detail
