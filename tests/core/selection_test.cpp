// The selection point: which backend kAuto picks for host data, and that a GPU backend asked for
// on host data (or in a build without CUDA) is refused by name with nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "support/test_util.hpp"

namespace fa_test {
namespace {

TEST(Selection, GpuBackendOnHostDataIsRefused) {
  Case c;
  c.dtype = DType::kBFloat16;
  Problem p = make_problem(c, fresh_seed("Selection.GpuBackendOnHostDataIsRefused"));
  const std::vector<float> before = p.o.storage;
  for (Backend b : {Backend::kCudaSm80, Backend::kCudaSm90}) {
    SCOPED_TRACE(flashattn::to_string(b));
    flashattn::Launch launch;
    launch.backend = b;
    const flashattn::Status s = flashattn::forward(p.forward_params(), launch);
    EXPECT_EQ(s.code, flashattn::StatusCode::kNotSupported) << s.message;
    EXPECT_FALSE(s.message.empty());
    EXPECT_EQ(0, std::memcmp(before.data(), p.o.storage.data(), before.size() * sizeof(float)))
        << "a refused call wrote the output";
    EXPECT_TRUE(std::all_of(p.lse.begin(), p.lse.end(), [](float x) { return std::isnan(x); }));
  }
}

TEST(Selection, AutoOnHostDataMatchesCpuBitForBit) {
  Case c;
  c.seqlen_q = 113;
  c.seqlen_k = 203;
  c.causal = true;
  Problem a = make_problem(c, fresh_seed("Selection.AutoOnHostDataMatchesCpuBitForBit"));
  Problem b = a;
  run_forward(a, Backend::kAuto);
  run_forward(b, Backend::kCpu);
  EXPECT_EQ(0, std::memcmp(a.o.storage.data(), b.o.storage.data(), a.o.storage.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)));
}

}  // namespace
}  // namespace fa_test
