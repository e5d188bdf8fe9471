#include "core/validate.hpp"

#include <cmath>
#include <limits>
#include <string>

#include "core/problem.hpp"

namespace flashattn::detail {

Status invalid(std::string message) { return {StatusCode::kInvalidArgument, std::move(message)}; }
Status not_supported(std::string message) { return {StatusCode::kNotSupported, std::move(message)}; }

namespace {

std::string str(int64_t x) { return std::to_string(x); }

bool valid_dtype(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16;
}

// Largest element offset reached by a strided view, or an error if it overflows int64_t.
// extents[i] > 0 for every dimension that is indexed.
Status check_extent(const char* name, std::initializer_list<std::pair<int64_t, int64_t>> dims) {
  int64_t last = 0;
  for (const auto& [extent, stride] : dims) {
    if (extent <= 0) continue;
    if (stride < 0) return invalid(std::string(name) + ": strides must be non-negative, got " + str(stride));
    int64_t term;
    if (__builtin_mul_overflow(extent - 1, stride, &term) || __builtin_add_overflow(last, term, &last))
      return invalid(std::string(name) + ": strides times sizes overflow int64_t");
  }
  return {};
}

// An output's elements must not share memory, or two threads write one element. Sorted by stride,
// each dimension must step past everything the smaller ones span. Runs after check_extent, so the
// products fit in int64_t.
Status check_disjoint(const char* name, std::initializer_list<std::pair<int64_t, int64_t>> dims) {
  std::pair<int64_t, int64_t> by_stride[4];  // (stride, extent), insertion-sorted by stride
  int n = 0;
  for (const auto& [extent, stride] : dims)
    if (extent == 0) return {};  // no elements, nothing can overlap
  for (const auto& [extent, stride] : dims) {
    if (extent <= 1 || n == 4) continue;
    int i = n++;
    for (; i > 0 && by_stride[i - 1].first > stride; --i) by_stride[i] = by_stride[i - 1];
    by_stride[i] = {stride, extent};
  }
  int64_t span = 0;  // largest offset the dimensions so far reach
  for (int i = 0; i < n; ++i) {
    const auto [stride, extent] = by_stride[i];
    if (stride <= span)
      return invalid(std::string(name) + ": an output's strides must not make elements overlap, but a stride of " +
                     str(stride) + " steps into the " + str(span + 1) + " elements the smaller dimensions span");
    span += (extent - 1) * stride;
  }
  return {};
}

struct Rows {
  int64_t batch;  // batch entries addressed through batch_stride (1 with varlen)
  int64_t q, k;   // rows addressed per batch entry (an upper bound with device-resident cu_seqlens)
  int64_t distinct_q, distinct_k;  // rows that must not overlap (q, k; the longest sequence when q, k are bounds)
};

Status check_tensor(const char* name, const void* data, const Rows& r, bool k_side, int64_t heads,
                    int64_t dim, int64_t batch_stride, int64_t row_stride, int64_t head_stride) {
  const int64_t rows = k_side ? r.k : r.q;
  if (r.batch == 0 || rows == 0) return {};
  if (data == nullptr) return invalid(std::string(name) + ": null pointer for a non-empty tensor");
  return check_extent(name, {{r.batch, batch_stride}, {rows, row_stride}, {heads, head_stride}, {dim, 1}});
}

template <class T>
Status check(const char* name, const T& t, const Rows& r, bool k_side, int64_t heads, int64_t dim) {
  return check_tensor(name, t.data, r, k_side, heads, dim, t.batch_stride, t.row_stride, t.head_stride);
}

// An output tensor: valid as an input, and no two elements share memory.
Status check_output(const char* name, const Tensor& t, const Rows& r, bool k_side, int64_t heads, int64_t dim) {
  if (Status s = check(name, t, r, k_side, heads, dim); !s) return s;
  return check_disjoint(name, {{r.batch, t.batch_stride}, {k_side ? r.distinct_k : r.distinct_q, t.row_stride},
                               {heads, t.head_stride}, {dim, 1}});
}

Status check_cu_seqlens(const char* name, const char* max_name, const int32_t* cu, int64_t batch, int64_t max_len,
                        int64_t* total) {
  if (cu[0] != 0) return invalid(std::string(name) + "[0] must be 0, got " + str(cu[0]));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = int64_t{cu[b + 1]} - cu[b];
    if (len < 0)
      return invalid(std::string(name) + " must be non-decreasing, but [" + str(b + 1) + "] = " + str(cu[b + 1]) +
                     " < [" + str(b) + "] = " + str(cu[b]));
    if (len > max_len)
      return invalid(std::string(name) + ": sequence " + str(b) + " has length " + str(len) +
                     ", above the maximum " + str(max_len) + " given in " + max_name);
  }
  *total = cu[batch];
  return {};
}

// Everything AttentionParams says on its own. Fills the row extents the outputs use.
Status check_attention(const AttentionParams& p, bool host_cu_seqlens, Rows* rows) {
  if (!valid_dtype(p.dtype)) return invalid("dtype: expected kFloat32, kFloat16 or kBFloat16");
  if (p.batch < 0) return invalid("batch: expected >= 0, got " + str(p.batch));
  if (p.seqlen_q < 0) return invalid("seqlen_q: expected >= 0, got " + str(p.seqlen_q));
  if (p.seqlen_k < 0) return invalid("seqlen_k: expected >= 0, got " + str(p.seqlen_k));
  if (p.heads_q <= 0) return invalid("heads_q: expected >= 1, got " + str(p.heads_q));
  if (p.heads_kv <= 0) return invalid("heads_kv: expected >= 1, got " + str(p.heads_kv));
  if (p.heads_q % p.heads_kv != 0)
    return invalid("heads_q: expected a multiple of heads_kv (" + str(p.heads_kv) + "), got " + str(p.heads_q));
  if (p.head_dim <= 0) return invalid("head_dim: expected >= 1, got " + str(p.head_dim));
  if (p.head_dim_v < 0) return invalid("head_dim_v: expected >= 0 (0 = head_dim), got " + str(p.head_dim_v));
  if (!std::isfinite(p.softmax_scale)) return invalid("softmax_scale: expected a finite number");
  if (!(p.softcap >= 0.0f) || !std::isfinite(p.softcap))
    return invalid("softcap: expected a finite number >= 0 (0 = off)");
  if (p.alignment != Alignment::kBottomRight && p.alignment != Alignment::kTopLeft)
    return invalid("alignment: expected kBottomRight or kTopLeft");
  if (p.window_left < -1) return invalid("window_left: expected >= 0 or -1 (unbounded), got " + str(p.window_left));
  if (p.window_right < -1) return invalid("window_right: expected >= 0 or -1 (unbounded), got " + str(p.window_right));

  const bool varlen_q = p.maybe_cu_seqlens_q != nullptr, varlen_k = p.maybe_cu_seqlens_k != nullptr;
  if (varlen_q != varlen_k)
    return invalid("maybe_cu_seqlens_q, maybe_cu_seqlens_k: give both (variable-length batch) or neither");
  *rows = {p.batch, p.seqlen_q, p.seqlen_k, p.seqlen_q, p.seqlen_k};
  if (varlen_q && p.batch > 0 && !host_cu_seqlens) {
    // Device-resident offsets: bound the packed rows by batch x the maximum lengths.
    int64_t total_q, total_k;
    if (__builtin_mul_overflow(p.batch, p.seqlen_q, &total_q) || __builtin_mul_overflow(p.batch, p.seqlen_k, &total_k))
      return invalid("batch, seqlen_q, seqlen_k: batch x seqlen overflows int64_t");
    *rows = {1, total_q, total_k, p.seqlen_q, p.seqlen_k};
  } else if (varlen_q && p.batch > 0) {
    int64_t total_q = 0, total_k = 0;
    if (Status s = check_cu_seqlens("maybe_cu_seqlens_q", "seqlen_q", p.maybe_cu_seqlens_q, p.batch, p.seqlen_q, &total_q); !s) return s;
    if (Status s = check_cu_seqlens("maybe_cu_seqlens_k", "seqlen_k", p.maybe_cu_seqlens_k, p.batch, p.seqlen_k, &total_k); !s) return s;
    *rows = {1, total_q, total_k, total_q, total_k};
  }

  const int64_t dv = p.head_dim_v > 0 ? p.head_dim_v : p.head_dim;
  if (Status s = check("q", p.q, *rows, false, p.heads_q, p.head_dim); !s) return s;
  if (Status s = check("k", p.k, *rows, true, p.heads_kv, p.head_dim); !s) return s;
  if (Status s = check("v", p.v, *rows, true, p.heads_kv, dv); !s) return s;

  if (p.maybe_alibi_slopes != nullptr && p.alibi_batch_stride < 0)
    return invalid("alibi_batch_stride: expected >= 0 (0 for [heads_q] slopes), got " + str(p.alibi_batch_stride));
  if (p.maybe_alibi_slopes != nullptr)
    if (Status s = check_extent("maybe_alibi_slopes", {{p.batch, p.alibi_batch_stride}, {p.heads_q, 1}}); !s) return s;

  if (p.maybe_bias.data != nullptr) {
    if (!valid_dtype(p.maybe_bias.dtype)) return invalid("maybe_bias.dtype: expected kFloat32, kFloat16 or kBFloat16");
    // With varlen, sequence b's bias is [b, h, 0..sq_b, 0..sk_b] of a [batch, heads, seqlen_q, seqlen_k] view.
    if (Status s = check_extent("maybe_bias", {{p.batch, p.maybe_bias.batch_stride}, {p.heads_q, p.maybe_bias.head_stride},
                                               {p.seqlen_q, p.maybe_bias.row_stride}, {p.seqlen_k, 1}});
        !s)
      return s;
  }
  if (p.maybe_mask.data != nullptr) {
    if (Status s = check_extent("maybe_mask", {{p.batch, p.maybe_mask.batch_stride}, {p.heads_q, p.maybe_mask.head_stride},
                                               {p.seqlen_q, p.maybe_mask.row_stride}, {p.seqlen_k, 1}});
        !s)
      return s;
  }
  return {};
}

Status check_lse(const char* name, const AttentionParams& p, const Rows& rows, const float* lse,
                 int64_t batch_stride, int64_t head_stride) {
  if (lse == nullptr || rows.batch == 0 || rows.q == 0) return {};
  return check_extent(name, {{rows.batch, batch_stride}, {p.heads_q, head_stride}, {rows.q, 1}});
}

Status check_lse_output(const AttentionParams& p, const Rows& rows, const float* lse, int64_t batch_stride,
                        int64_t head_stride) {
  if (Status s = check_lse("maybe_lse", p, rows, lse, batch_stride, head_stride); !s || lse == nullptr) return s;
  return check_disjoint("maybe_lse", {{rows.batch, batch_stride}, {p.heads_q, head_stride}, {rows.distinct_q, 1}});
}

}  // namespace

Status validate_forward(const ForwardParams& p, bool host_cu_seqlens) {
  Rows rows{};
  if (Status s = check_attention(p, host_cu_seqlens, &rows); !s) return s;
  const int64_t dv = p.head_dim_v > 0 ? p.head_dim_v : p.head_dim;
  if (Status s = check_output("o", p.o, rows, false, p.heads_q, dv); !s) return s;
  return check_lse_output(p, rows, p.maybe_lse, p.lse_batch_stride, p.lse_head_stride);
}

Status validate_backward(const BackwardParams& p, bool host_cu_seqlens) {
  Rows rows{};
  if (Status s = check_attention(p, host_cu_seqlens, &rows); !s) return s;
  const int64_t dv = p.head_dim_v > 0 ? p.head_dim_v : p.head_dim;
  if (Status s = check("o", p.o, rows, false, p.heads_q, dv); !s) return s;
  if (Status s = check("d_o", p.d_o, rows, false, p.heads_q, dv); !s) return s;
  if (Status s = check_output("dq", p.dq, rows, false, p.heads_q, p.head_dim); !s) return s;
  if (Status s = check_output("dk", p.dk, rows, true, p.heads_kv, p.head_dim); !s) return s;
  if (Status s = check_output("dv", p.dv, rows, true, p.heads_kv, dv); !s) return s;
  if (rows.batch > 0 && rows.q > 0 && p.lse == nullptr)
    return invalid("lse: the backward pass needs the forward's log-sum-exp (got a null pointer)");
  return check_lse("lse", p, rows, p.lse, p.lse_batch_stride, p.lse_head_stride);
}

Status validate_launch(const Launch& launch) {
  switch (launch.backend) {
    case Backend::kAuto: case Backend::kCpu: case Backend::kReference: case Backend::kStandard:
    case Backend::kCudaSm80:
    case Backend::kCudaSm90: break;
    default: return invalid("launch.backend: unknown backend value " + str(static_cast<int>(launch.backend)));
  }
  if (launch.num_threads < 0)
    return invalid("launch.num_threads: expected >= 0 (0 = every hardware thread), got " + str(launch.num_threads));
  if (launch.workspace == nullptr && launch.workspace_bytes != 0)
    return invalid("launch.workspace: null pointer with workspace_bytes = " + std::to_string(launch.workspace_bytes));
  return {};
}

}  // namespace flashattn::detail
