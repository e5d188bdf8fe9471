#include "core/thread_pool.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace flashattn::detail {
namespace {

struct Task {
  TaskFn fn;
  void* ctx;
  void operator()(int64_t task, int worker) const { fn(ctx, task, worker); }
};

class Pool {
 public:
  explicit Pool(int workers) {
    for (int w = 1; w <= workers; ++w) threads_.emplace_back([this, w] { work_loop(w); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  int size() const { return static_cast<int>(threads_.size()) + 1; }

  // Returns false (having run nothing) when another caller holds the pool.
  bool try_run(int64_t num_tasks, int threads, const Task& fn) {
    std::unique_lock<std::mutex> call(call_mu_, std::try_to_lock);
    if (!call.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      num_tasks_ = num_tasks;
      next_.store(0);
      active_ = threads - 1;
      pending_ = threads - 1;
      ++generation_;
    }
    cv_.notify_all();
    drain(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_ == 0; });
    fn_ = nullptr;
    return true;
  }

 private:
  void drain(int worker) {
    for (int64_t t; (t = next_.fetch_add(1)) < num_tasks_;) (*fn_)(t, worker);
  }

  void work_loop(int worker) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || (generation_ != seen && worker <= active_); });
        if (stop_) return;
        seen = generation_;
      }
      drain(worker);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex call_mu_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const Task* fn_ = nullptr;
  int64_t num_tasks_ = 0;
  std::atomic<int64_t> next_{0};
  int active_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

Pool& pool() {
  static Pool p(hardware_threads() - 1);
  return p;
}

}  // namespace

int hardware_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

int resolve_threads(int requested) {
  const int hw = hardware_threads();
  return requested <= 0 ? hw : std::min(requested, hw);
}

void parallel_for_fn(int64_t num_tasks, int threads, TaskFn fn, void* ctx) {
  const Task task{fn, ctx};
  threads = static_cast<int>(std::min<int64_t>(std::max(threads, 1), std::max<int64_t>(num_tasks, 1)));
  if (threads > 1 && pool().try_run(num_tasks, std::min(threads, pool().size()), task)) return;
  for (int64_t t = 0; t < num_tasks; ++t) task(t, 0);
}

}  // namespace flashattn::detail
