#include "workload.hpp"

#include <cmath>
#include <limits>

#include "core/dtype.hpp"

namespace fa_bench {
namespace {

namespace d = flashattn::detail;

uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

}  // namespace

Storage::Storage(flashattn::DType dtype, int64_t elements)
    : dtype_(dtype),
      elements_(elements),
      words_(static_cast<size_t>((elements * static_cast<int64_t>(d::dtype_size(dtype)) + 3) / 4)) {}

size_t Storage::bytes() const { return static_cast<size_t>(elements_) * d::dtype_size(dtype_); }

float Storage::get(int64_t i) const { return d::load_float(words_.data(), dtype_, i); }

void Storage::fill_random(uint64_t seed) {
  const float half_width = std::sqrt(3.0f);
  uint64_t state = seed;
  for (int64_t i = 0; i < elements_; ++i) {
    const float u = static_cast<float>(splitmix64(&state) >> 40) * 0x1.0p-24f;  // [0, 1)
    d::store_float(words_.data(), dtype_, i, (2.0f * u - 1.0f) * half_width);
  }
}

void Storage::fill_nan() {
  for (int64_t i = 0; i < elements_; ++i) d::store_float(words_.data(), dtype_, i, kNaN);
}

double max_abs_diff(const Storage& a, const Storage& b) {
  double worst = 0.0;
  for (int64_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double x = a.get(i), y = b.get(i);
    if (std::isnan(x) && std::isnan(y)) continue;
    const double diff = x == y ? 0.0 : std::fabs(x - y);  // equal infinities agree
    if (!(diff <= worst)) worst = std::isnan(diff) ? std::numeric_limits<double>::infinity() : diff;
  }
  return worst;
}

Workload::Workload(const Shape& s, uint64_t seed, bool backward) : shape_(s) {
  const int64_t q_elems = s.batch * s.seqlen_q * s.heads_q * s.head_dim;
  const int64_t o_elems = s.batch * s.seqlen_q * s.heads_q * s.head_dim_v;
  const int64_t k_elems = s.batch * s.seqlen_k * s.heads_kv * s.head_dim;
  const int64_t v_elems = s.batch * s.seqlen_k * s.heads_kv * s.head_dim_v;
  const int64_t rows = s.batch * s.heads_q * s.seqlen_q;
  q_ = Storage(s.dtype, q_elems);
  k_ = Storage(s.dtype, k_elems);
  v_ = Storage(s.dtype, v_elems);
  q_.fill_random(seed ^ 0x51ull);
  k_.fill_random(seed ^ 0x4bull);
  v_.fill_random(seed ^ 0x56ull);
  o_flash_ = Storage(s.dtype, o_elems);
  o_standard_ = Storage(s.dtype, o_elems);
  o_flash_.fill_nan();
  o_standard_.fill_nan();
  lse_flash_.assign(static_cast<size_t>(rows), kNaN);
  lse_standard_.assign(static_cast<size_t>(rows), kNaN);
  if (backward) {
    d_o_ = Storage(s.dtype, o_elems);
    d_o_.fill_random(seed ^ 0x644full);
    for (Storage* t : {&dq_flash_, &dq_standard_}) *t = Storage(s.dtype, q_elems);
    for (Storage* t : {&dk_flash_, &dk_standard_}) *t = Storage(s.dtype, k_elems);
    for (Storage* t : {&dv_flash_, &dv_standard_}) *t = Storage(s.dtype, v_elems);
    for (Storage* t : {&dq_flash_, &dq_standard_, &dk_flash_, &dk_standard_, &dv_flash_, &dv_standard_}) t->fill_nan();
  }
}

void Workload::poison_gradients(Path path) {
  const bool flash = path == Path::kFlash;
  for (Storage* t : {flash ? &dq_flash_ : &dq_standard_, flash ? &dk_flash_ : &dk_standard_,
                     flash ? &dv_flash_ : &dv_standard_})
    t->fill_nan();
}

flashattn::AttentionParams Workload::attention_params() const {
  const Shape& s = shape_;
  flashattn::AttentionParams p;
  p.dtype = s.dtype;
  p.batch = s.batch;
  p.seqlen_q = s.seqlen_q;
  p.seqlen_k = s.seqlen_k;
  p.heads_q = s.heads_q;
  p.heads_kv = s.heads_kv;
  p.head_dim = s.head_dim;
  p.head_dim_v = s.head_dim_v;
  p.q = flashattn::contiguous(q_.data(), s.seqlen_q, s.heads_q, s.head_dim);
  p.k = flashattn::contiguous(k_.data(), s.seqlen_k, s.heads_kv, s.head_dim);
  p.v = flashattn::contiguous(v_.data(), s.seqlen_k, s.heads_kv, s.head_dim_v);
  p.causal = s.causal;
  p.alignment = s.alignment;
  p.window_left = s.window_left;
  p.window_right = s.window_right;
  p.softcap = s.softcap;
  return p;
}

flashattn::ForwardParams Workload::forward_params(Path path) {
  const Shape& s = shape_;
  flashattn::ForwardParams p;
  static_cast<flashattn::AttentionParams&>(p) = attention_params();
  Storage& o = path == Path::kFlash ? o_flash_ : o_standard_;
  std::vector<float>& lse = path == Path::kFlash ? lse_flash_ : lse_standard_;
  p.o = flashattn::contiguous(o.data(), s.seqlen_q, s.heads_q, s.head_dim_v);
  p.maybe_lse = lse.data();
  p.lse_batch_stride = s.heads_q * s.seqlen_q;
  p.lse_head_stride = s.seqlen_q;
  return p;
}

flashattn::BackwardParams Workload::backward_params(Path path) {
  const Shape& s = shape_;
  flashattn::BackwardParams p;
  static_cast<flashattn::AttentionParams&>(p) = attention_params();
  p.o = flashattn::contiguous(static_cast<const void*>(o_flash_.data()), s.seqlen_q, s.heads_q, s.head_dim_v);
  p.d_o = flashattn::contiguous(static_cast<const void*>(d_o_.data()), s.seqlen_q, s.heads_q, s.head_dim_v);
  p.lse = lse_flash_.data();
  p.lse_batch_stride = s.heads_q * s.seqlen_q;
  p.lse_head_stride = s.seqlen_q;
  const bool flash = path == Path::kFlash;
  p.dq = flashattn::contiguous((flash ? dq_flash_ : dq_standard_).data(), s.seqlen_q, s.heads_q, s.head_dim);
  p.dk = flashattn::contiguous((flash ? dk_flash_ : dk_standard_).data(), s.seqlen_k, s.heads_kv, s.head_dim);
  p.dv = flashattn::contiguous((flash ? dv_flash_ : dv_standard_).data(), s.seqlen_k, s.heads_kv, s.head_dim_v);
  return p;
}

}  // namespace fa_bench
