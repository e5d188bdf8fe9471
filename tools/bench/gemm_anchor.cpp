#include "gemm_anchor.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <thread>
#include <vector>

#include "timing.hpp"

namespace fa_bench {
namespace {

// cblas enum values (cblas.h): the only ones used here.
constexpr int kCblasRowMajor = 101;
constexpr int kCblasNoTrans = 111;

// Longer than OpenBLAS's default worker spin time (2^28 cycles, ~0.1 s at 2.5 GHz).
constexpr std::chrono::milliseconds kOpenBlasIdle{300};

using SgemmFn = void (*)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a,
                         int lda, const float* b, int ldb, float beta, float* c, int ldc);
using SetThreadsFn = void (*)(int);
using GetThreadsFn = int (*)();
using CorenameFn = char* (*)();

struct OpenBlas {
  SgemmFn sgemm = nullptr;
  SetThreadsFn set_num_threads = nullptr;
  GetThreadsFn get_num_threads = nullptr;
  CorenameFn get_corename = nullptr;
};

// Loads OpenBLAS once per process with the core type forced for this CPU.
const OpenBlas* load_openblas(std::string* error) {
  static std::optional<OpenBlas> lib;
  static std::string load_error;
  static bool tried = false;
  if (!tried) {
    tried = true;
    const char* old = std::getenv("OPENBLAS_CORETYPE");
    const std::optional<std::string> saved = old ? std::optional<std::string>(old) : std::nullopt;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
      setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
    else
      unsetenv("OPENBLAS_CORETYPE");
    const char* override_name = std::getenv("FLASHATTN_OPENBLAS_LIB");
    const std::string name = override_name && *override_name ? override_name : "libopenblas.so.0";
    void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (saved)
      setenv("OPENBLAS_CORETYPE", saved->c_str(), 1);
    else
      unsetenv("OPENBLAS_CORETYPE");
    if (handle == nullptr) {
      const char* why = dlerror();
      load_error = "OpenBLAS not found: " + (why ? std::string(why) : "dlopen(" + name + ") failed") +
                   " (install libopenblas-dev)";
    } else {
      OpenBlas b;
      b.sgemm = reinterpret_cast<SgemmFn>(dlsym(handle, "cblas_sgemm"));
      b.set_num_threads = reinterpret_cast<SetThreadsFn>(dlsym(handle, "openblas_set_num_threads"));
      b.get_num_threads = reinterpret_cast<GetThreadsFn>(dlsym(handle, "openblas_get_num_threads"));
      b.get_corename = reinterpret_cast<CorenameFn>(dlsym(handle, "openblas_get_corename"));
      if (!b.sgemm || !b.set_num_threads || !b.get_num_threads || !b.get_corename)
        load_error = name + " lacks cblas_sgemm / openblas_set_num_threads / openblas_get_corename";
      else
        lib = b;
    }
  }
  *error = load_error;
  return lib ? &*lib : nullptr;
}

}  // namespace

GemmResult measure_sgemm(int64_t size, int threads, int repeats, double max_seconds) {
  GemmResult r;
  r.size = size;
  const OpenBlas* blas = load_openblas(&r.error);
  if (blas == nullptr) return r;
  if (size > (int64_t{1} << 15)) {
    r.error = "gemm size too large";
    return r;
  }
  blas->set_num_threads(threads);
  r.threads = blas->get_num_threads();
  const char* core = blas->get_corename();
  r.core = core ? core : "unknown";

  const int n = static_cast<int>(size);
  const size_t elems = static_cast<size_t>(size) * static_cast<size_t>(size);
  std::vector<float> a(elems), b(elems), c(elems);
  for (size_t i = 0; i < elems; ++i) {  // small values, no denormals or overflow
    a[i] = static_cast<float>(static_cast<int>(i % 7) - 3) * 0.25f;
    b[i] = static_cast<float>(static_cast<int>(i % 5) - 2) * 0.5f;
  }
  Timing t;
  measure([&] {
    blas->sgemm(kCblasRowMajor, kCblasNoTrans, kCblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                c.data(), n);
    return true;
  }, repeats, max_seconds, &t);
  // OpenBLAS workers busy-wait after a call before they sleep (about 2^28 cycles by default).
  std::this_thread::sleep_for(kOpenBlasIdle);
  r.available = true;
  r.median_ms = t.median_ms;
  r.gflops = gflops(2.0 * static_cast<double>(size) * static_cast<double>(size) * static_cast<double>(size),
                    t.median_ms);
  return r;
}

GemmResult combine_phases(const GemmResult& before, const GemmResult& after) {
  if (!before.available || !after.available) return before.available ? before : after;
  GemmResult r = after.gflops >= before.gflops ? after : before;
  r.gflops_before = before.gflops;
  r.gflops_after = after.gflops;
  return r;
}

}  // namespace fa_bench
