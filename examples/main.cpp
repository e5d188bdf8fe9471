// flashattn from an installed package: causal GQA attention through the C++ API and through the C
// ABI (c_api_attention.c), a checksum of each, and a check that both give the same bits and agree
// with attention written out by hand on a few rows.
#include <flashattn/flashattn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "c_api_attention.h"

namespace {

constexpr int64_t kBatch = 2, kSeqQ = 100, kSeqK = 130, kHeadsQ = 8, kHeadsKv = 2, kHeadDim = 64;

double checksum(const std::vector<float>& x) {
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * (1.0 + static_cast<double>(i % 7));
  return s;
}

// Row i of head h in batch b, written out: softmax over the keys causal (bottom-right) lets it see.
double max_error_of_row(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                        const std::vector<float>& o, int64_t b, int64_t h, int64_t i) {
  const int64_t hk = h / (kHeadsQ / kHeadsKv), visible = i + (kSeqK - kSeqQ) + 1;
  const auto at = [](int64_t bb, int64_t r, int64_t hh, int64_t heads, int64_t seq) {
    return ((bb * seq + r) * heads + hh) * kHeadDim;
  };
  std::vector<double> p(static_cast<size_t>(visible));
  double mx = -INFINITY, sum = 0;
  for (int64_t j = 0; j < visible; ++j) {
    double dot = 0;
    for (int64_t d = 0; d < kHeadDim; ++d)
      dot += double(q[at(b, i, h, kHeadsQ, kSeqQ) + d]) * k[at(b, j, hk, kHeadsKv, kSeqK) + d];
    p[j] = dot / std::sqrt(double(kHeadDim));
    mx = std::max(mx, p[j]);
  }
  for (double& x : p) sum += (x = std::exp(x - mx));
  double err = 0;
  for (int64_t d = 0; d < kHeadDim; ++d) {
    double want = 0;
    for (int64_t j = 0; j < visible; ++j) want += p[j] / sum * v[at(b, j, hk, kHeadsKv, kSeqK) + d];
    err = std::max(err, std::abs(want - o[at(b, i, h, kHeadsQ, kSeqQ) + d]));
  }
  return err;
}

}  // namespace

int main() {
  std::mt19937 rng(2024);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(kBatch * kSeqQ * kHeadsQ * kHeadDim), k(kBatch * kSeqK * kHeadsKv * kHeadDim), v(k.size());
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = normal(rng);

  // C++ API.
  std::vector<float> o_cpp(q.size()), lse_cpp(kBatch * kHeadsQ * kSeqQ);
  flashattn::ForwardParams p;
  p.dtype = flashattn::DType::kFloat32;
  p.batch = kBatch;
  p.seqlen_q = kSeqQ;
  p.seqlen_k = kSeqK;
  p.heads_q = kHeadsQ;
  p.heads_kv = kHeadsKv;
  p.head_dim = kHeadDim;
  p.causal = true;  // bottom-right: query i sees keys j <= i + seqlen_k - seqlen_q
  p.q = flashattn::contiguous(std::as_const(q).data(), kSeqQ, kHeadsQ, kHeadDim);
  p.k = flashattn::contiguous(std::as_const(k).data(), kSeqK, kHeadsKv, kHeadDim);
  p.v = flashattn::contiguous(std::as_const(v).data(), kSeqK, kHeadsKv, kHeadDim);
  p.o = flashattn::contiguous(o_cpp.data(), kSeqQ, kHeadsQ, kHeadDim);
  p.maybe_lse = lse_cpp.data();
  p.lse_batch_stride = kHeadsQ * kSeqQ;
  p.lse_head_stride = kSeqQ;
  flashattn::Launch launch;
  launch.backend = flashattn::Backend::kCpu;
  if (const flashattn::Status s = flashattn::forward(p, launch); !s) {
    std::fprintf(stderr, "flashattn::forward: %s: %s\n", flashattn::to_string(s.code), s.message.c_str());
    return 1;
  }

  // C ABI.
  std::vector<float> o_c(q.size()), lse_c(lse_cpp.size());
  if (c_api_attention(q.data(), k.data(), v.data(), o_c.data(), lse_c.data(), kBatch, kSeqQ, kSeqK, kHeadsQ,
                      kHeadsKv, kHeadDim, 1) != 0)
    return 1;

  const bool same = std::memcmp(o_cpp.data(), o_c.data(), o_c.size() * sizeof(float)) == 0 &&
                    std::memcmp(lse_cpp.data(), lse_c.data(), lse_c.size() * sizeof(float)) == 0;
  double err = 0;
  for (int64_t b = 0; b < kBatch; ++b)
    for (int64_t h : {int64_t{0}, kHeadsQ - 1})
      for (int64_t i : {int64_t{0}, kSeqQ / 2, kSeqQ - 1}) err = std::max(err, max_error_of_row(q, k, v, o_cpp, b, h, i));

  std::printf("C++ API: checksum(o) = %.9g  checksum(lse) = %.9g\n", checksum(o_cpp), checksum(lse_cpp));
  std::printf("C ABI:   checksum(o) = %.9g  checksum(lse) = %.9g\n", checksum(o_c), checksum(lse_c));
  std::printf("C and C++ results bit-identical: %s; max |error| against rows written out: %.3g\n",
              same ? "yes" : "NO", err);
  if (!same || !(err < 1e-4)) {
    std::fprintf(stderr, "example FAILED: %s\n", same ? "results differ from attention written out" : "C and C++ results differ");
    return 1;
  }
  return 0;
}
