// The C ABI (include/flashattn/flashattn.h): converts the C structs to the C++ params and calls the
// same three entry points per operation, so the C and C++ APIs cannot disagree. No state outside
// the call; no exception crosses the boundary.
#include "flashattn/flashattn.h"

#include <cstddef>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <new>
#include <string>

#include "flashattn/flashattn.hpp"

namespace flashattn::detail {
namespace {

// The enum values are part of the ABI: the C constants are the C++ enumerators' values.
static_assert(FA_STATUS_OK == static_cast<int32_t>(StatusCode::kOk));
static_assert(FA_STATUS_INVALID_ARGUMENT == static_cast<int32_t>(StatusCode::kInvalidArgument));
static_assert(FA_STATUS_NOT_SUPPORTED == static_cast<int32_t>(StatusCode::kNotSupported));
static_assert(FA_STATUS_WORKSPACE_TOO_SMALL == static_cast<int32_t>(StatusCode::kWorkspaceTooSmall));
static_assert(FA_STATUS_INTERNAL == static_cast<int32_t>(StatusCode::kInternal));
static_assert(FA_DTYPE_FLOAT32 == static_cast<int32_t>(DType::kFloat32));
static_assert(FA_DTYPE_FLOAT16 == static_cast<int32_t>(DType::kFloat16));
static_assert(FA_DTYPE_BFLOAT16 == static_cast<int32_t>(DType::kBFloat16));
static_assert(FA_ALIGN_BOTTOM_RIGHT == static_cast<int32_t>(Alignment::kBottomRight));
static_assert(FA_ALIGN_TOP_LEFT == static_cast<int32_t>(Alignment::kTopLeft));
static_assert(FA_BACKEND_AUTO == static_cast<int32_t>(Backend::kAuto));
static_assert(FA_BACKEND_CPU == static_cast<int32_t>(Backend::kCpu));
static_assert(FA_BACKEND_REFERENCE == static_cast<int32_t>(Backend::kReference));
static_assert(FA_BACKEND_STANDARD == static_cast<int32_t>(Backend::kStandard));
static_assert(FA_BACKEND_CUDA_SM80 == static_cast<int32_t>(Backend::kCudaSm80));
static_assert(FA_BACKEND_CUDA_SM90 == static_cast<int32_t>(Backend::kCudaSm90));
static_assert(sizeof(int) == sizeof(int32_t), "Launch::num_threads travels as int32_t");

// struct_size values this library reads, one per C ABI version. Layout changes only ever append
// fields; a new version adds its size here and the fields past an older size keep their defaults.
// The sizes are pinned for LP64 so that an accidental layout change fails to compile.
constexpr size_t kForwardParamsV1 = sizeof(fa_forward_params);
constexpr size_t kBackwardParamsV1 = offsetof(fa_backward_params, deterministic);  // v1 ended with dv
constexpr size_t kBackwardParamsV2 = sizeof(fa_backward_params);
constexpr size_t kLaunchV1 = sizeof(fa_launch);
static_assert(sizeof(void*) != 8 || kForwardParamsV1 == 360, "fa_forward_params v1 layout changed");
static_assert(sizeof(void*) != 8 || kBackwardParamsV1 == 488, "fa_backward_params v1 layout changed");
static_assert(sizeof(void*) != 8 || kBackwardParamsV2 == 496, "fa_backward_params v2 layout changed");
static_assert(kBackwardParamsV1 % alignof(fa_backward_params) == 0, "v1 callers' sizeof is the v2 offset");
static_assert(sizeof(void*) != 8 || kLaunchV1 == 40, "fa_launch v1 layout changed");

// Writes a + b into the caller's buffer, truncated and NUL-terminated; allocates nothing (it also
// reports out-of-memory).
void write_message(char* err, size_t err_len, const char* a, const char* b = "") {
  if (err == nullptr || err_len == 0) return;
  size_t n = 0;
  for (const char* s : {a, b})
    for (; *s != '\0' && n + 1 < err_len; ++s) err[n++] = *s;
  err[n] = '\0';
}

fa_status report(const Status& s, char* err, size_t err_len) {
  write_message(err, err_len, s.message.c_str());
  return static_cast<fa_status>(s.code);
}

fa_status reject(const char* message, char* err, size_t err_len) {
  write_message(err, err_len, message);
  return FA_STATUS_INVALID_ARGUMENT;
}

// Runs body() (which returns an fa_status) with every exception mapped to FA_STATUS_INTERNAL.
template <class Body>
fa_status guarded(char* err, size_t err_len, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    write_message(err, err_len, "internal error: out of memory");
  } catch (const std::exception& e) {
    write_message(err, err_len, "internal error: ", e.what());
  } catch (...) {
    write_message(err, err_len, "internal error: unknown exception");
  }
  return FA_STATUS_INTERNAL;
}

ConstTensor to_cpp(const fa_const_tensor& t) { return {t.data, t.batch_stride, t.row_stride, t.head_stride}; }
Tensor to_cpp(const fa_tensor& t) { return {t.data, t.batch_stride, t.row_stride, t.head_stride}; }

// The fields fa_forward_params and fa_backward_params share, named as in AttentionParams.
template <class C>
void to_cpp_attention(const C& c, AttentionParams& a) {
  a.dtype = static_cast<DType>(c.dtype);
  a.batch = c.batch;
  a.seqlen_q = c.seqlen_q;
  a.seqlen_k = c.seqlen_k;
  a.heads_q = c.heads_q;
  a.heads_kv = c.heads_kv;
  a.head_dim = c.head_dim;
  a.head_dim_v = c.head_dim_v;
  a.q = to_cpp(c.q);
  a.k = to_cpp(c.k);
  a.v = to_cpp(c.v);
  a.maybe_cu_seqlens_q = c.maybe_cu_seqlens_q;
  a.maybe_cu_seqlens_k = c.maybe_cu_seqlens_k;
  a.softmax_scale = c.softmax_scale;
  a.causal = c.causal != 0;
  a.alignment = static_cast<Alignment>(c.alignment);
  a.window_left = c.window_left;
  a.window_right = c.window_right;
  a.softcap = c.softcap;
  a.maybe_alibi_slopes = c.maybe_alibi_slopes;
  a.alibi_batch_stride = c.alibi_batch_stride;
  a.maybe_bias = {c.maybe_bias.data, static_cast<DType>(c.maybe_bias.dtype), c.maybe_bias.batch_stride,
                  c.maybe_bias.head_stride, c.maybe_bias.row_stride};
  a.maybe_mask = {c.maybe_mask.data, c.maybe_mask.batch_stride, c.maybe_mask.head_stride, c.maybe_mask.row_stride};
}

// Copies a caller's struct of a known version into a current one (later fields keep their
// defaults), or returns false when struct_size is not a version this library knows.
template <class C>
bool read_versioned(const C& in, C* out, void (*init)(C*), std::initializer_list<size_t> known_sizes) {
  bool known = false;
  for (size_t s : known_sizes) known = known || in.struct_size == s;
  if (!known) return false;
  init(out);
  std::memcpy(static_cast<void*>(out), &in, in.struct_size);
  out->struct_size = sizeof(C);
  return true;
}

fa_status convert(const fa_launch* c, Launch* launch, char* err, size_t err_len) {
  if (c == nullptr) return FA_STATUS_OK;  // all defaults
  fa_launch l;
  if (!read_versioned(*c, &l, fa_launch_init, {kLaunchV1}))
    return reject("launch.struct_size: not a fa_launch size this library knows; call fa_launch_init", err, err_len);
  launch->backend = static_cast<Backend>(l.backend);
  launch->num_threads = l.num_threads;
  launch->stream = l.stream;
  launch->workspace = l.workspace;
  launch->workspace_bytes = l.workspace_bytes;
  return FA_STATUS_OK;
}

fa_status convert(const fa_forward_params* c, ForwardParams* p, char* err, size_t err_len) {
  if (c == nullptr) return reject("params: null pointer", err, err_len);
  fa_forward_params v;
  if (!read_versioned(*c, &v, fa_forward_params_init, {kForwardParamsV1}))
    return reject("params.struct_size: not a fa_forward_params size this library knows; call fa_forward_params_init",
                  err, err_len);
  to_cpp_attention(v, *p);
  p->o = to_cpp(v.o);
  p->maybe_lse = v.maybe_lse;
  p->lse_batch_stride = v.lse_batch_stride;
  p->lse_head_stride = v.lse_head_stride;
  return FA_STATUS_OK;
}

fa_status convert(const fa_backward_params* c, BackwardParams* p, char* err, size_t err_len) {
  if (c == nullptr) return reject("params: null pointer", err, err_len);
  fa_backward_params v;
  if (!read_versioned(*c, &v, fa_backward_params_init, {kBackwardParamsV1, kBackwardParamsV2}))
    return reject("params.struct_size: not a fa_backward_params size this library knows; call fa_backward_params_init",
                  err, err_len);
  to_cpp_attention(v, *p);
  p->o = to_cpp(v.o);
  p->d_o = to_cpp(v.d_o);
  p->lse = v.lse;
  p->lse_batch_stride = v.lse_batch_stride;
  p->lse_head_stride = v.lse_head_stride;
  p->dq = to_cpp(v.dq);
  p->dk = to_cpp(v.dk);
  p->dv = to_cpp(v.dv);
  p->deterministic = v.deterministic != 0;
  return FA_STATUS_OK;
}

// One C entry point: convert params and launch, then call the C++ function `op` on them.
template <class Params, class CParams, class Op>
fa_status call(const CParams* c, const fa_launch* cl, char* err, size_t err_len, Op&& op) noexcept {
  return guarded(err, err_len, [&]() -> fa_status {
    Params p;
    Launch launch;
    if (fa_status s = convert(c, &p, err, err_len); s != FA_STATUS_OK) return s;
    if (fa_status s = convert(cl, &launch, err, err_len); s != FA_STATUS_OK) return s;
    return report(op(p, launch), err, err_len);
  });
}

// Attention fields the C++ member initialisers set, copied so that the two cannot drift apart.
template <class C>
void init_attention(C* c) {
  const AttentionParams d;
  c->dtype = static_cast<int32_t>(d.dtype);
  c->softmax_scale = d.softmax_scale;
  c->causal = d.causal ? 1 : 0;
  c->alignment = static_cast<int32_t>(d.alignment);
  c->window_left = d.window_left;
  c->window_right = d.window_right;
  c->softcap = d.softcap;
  c->alibi_batch_stride = d.alibi_batch_stride;
  c->maybe_bias.dtype = static_cast<int32_t>(d.maybe_bias.dtype);
}

}  // namespace
}  // namespace flashattn::detail

using namespace flashattn;
using namespace flashattn::detail;

extern "C" {

void fa_forward_params_init(fa_forward_params* params) {
  if (params == nullptr) return;
  std::memset(static_cast<void*>(params), 0, sizeof(*params));
  params->struct_size = sizeof(*params);
  init_attention(params);
}

void fa_backward_params_init(fa_backward_params* params) {
  if (params == nullptr) return;
  std::memset(static_cast<void*>(params), 0, sizeof(*params));
  params->struct_size = sizeof(*params);
  init_attention(params);
  params->deterministic = BackwardParams{}.deterministic ? 1 : 0;
}

void fa_launch_init(fa_launch* launch) {
  if (launch == nullptr) return;
  std::memset(static_cast<void*>(launch), 0, sizeof(*launch));
  launch->struct_size = sizeof(*launch);
  const Launch d;
  launch->backend = static_cast<int32_t>(d.backend);
  launch->num_threads = d.num_threads;
  launch->stream = d.stream;
  launch->workspace = d.workspace;
  launch->workspace_bytes = d.workspace_bytes;
}

fa_status fa_forward_supported(const fa_forward_params* params, const fa_launch* launch, char* err, size_t err_len) {
  return call<ForwardParams>(params, launch, err, err_len,
              [](const ForwardParams& p, const Launch& l) { return forward_supported(p, l); });
}

fa_status fa_forward_workspace_size(const fa_forward_params* params, const fa_launch* launch, size_t* bytes,
                                    char* err, size_t err_len) {
  return call<ForwardParams>(params, launch, err, err_len,
              [bytes](const ForwardParams& p, const Launch& l) { return forward_workspace_size(p, l, bytes); });
}

fa_status fa_forward(const fa_forward_params* params, const fa_launch* launch, char* err, size_t err_len) {
  return call<ForwardParams>(params, launch, err, err_len, [](const ForwardParams& p, const Launch& l) { return forward(p, l); });
}

fa_status fa_backward_supported(const fa_backward_params* params, const fa_launch* launch, char* err,
                                size_t err_len) {
  return call<BackwardParams>(params, launch, err, err_len,
              [](const BackwardParams& p, const Launch& l) { return backward_supported(p, l); });
}

fa_status fa_backward_workspace_size(const fa_backward_params* params, const fa_launch* launch, size_t* bytes,
                                     char* err, size_t err_len) {
  return call<BackwardParams>(params, launch, err, err_len,
              [bytes](const BackwardParams& p, const Launch& l) { return backward_workspace_size(p, l, bytes); });
}

fa_status fa_backward(const fa_backward_params* params, const fa_launch* launch, char* err, size_t err_len) {
  return call<BackwardParams>(params, launch, err, err_len, [](const BackwardParams& p, const Launch& l) { return backward(p, l); });
}

const char* fa_status_string(fa_status status) {
  switch (status) {
    case FA_STATUS_OK: case FA_STATUS_INVALID_ARGUMENT: case FA_STATUS_NOT_SUPPORTED:
    case FA_STATUS_WORKSPACE_TOO_SMALL: case FA_STATUS_INTERNAL:
      return to_string(static_cast<StatusCode>(status));
  }
  return "unknown";
}

const char* fa_dtype_string(int32_t dtype) { return to_string(static_cast<DType>(dtype)); }
const char* fa_backend_string(int32_t backend) { return to_string(static_cast<Backend>(backend)); }

}  // extern "C"
