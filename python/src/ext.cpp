// flashattn._ext: the nanobind binding of the C++ API, framework-free.
//
// Every array arrives through DLPack (or the buffer protocol) as a zero-copy view: NumPy, PyTorch,
// CuPy, JAX. Outputs are allocated by the Python layer with the caller's framework and passed in, so
// this file never allocates tensor memory. It checks what the C++ API cannot see (ranks, shapes,
// dtypes, devices), derives sizes and element strides, and maps a C++ Status onto ValueError naming
// the Python argument. The GIL is released while the kernels run.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "flashattn/flashattn.hpp"

namespace nb = nanobind;
namespace fa = flashattn;

namespace {

using InArray = nb::ndarray<nb::ro>;  // read-only view of any array
using OutArray = nb::ndarray<>;       // writable view

// What this file needs of an array, whichever nb::ndarray flavour it came from.
struct View {
  const char* name = nullptr;
  const void* data = nullptr;
  int64_t ndim = 0;
  const int64_t* shape = nullptr;
  const int64_t* strides = nullptr;  // in elements
  nb::dlpack::dtype dtype{};
  int device_type = 0;
  int device_id = 0;
  bool present = false;

  int64_t size(int64_t i) const { return shape[i < 0 ? ndim + i : i]; }
  int64_t stride(int64_t i) const { return strides[i < 0 ? ndim + i : i]; }
};

template <class A>
View view(const char* name, const A& a) {
  View v;
  v.name = name;
  v.data = a.data();
  v.ndim = static_cast<int64_t>(a.ndim());
  v.shape = a.shape_ptr();
  v.strides = a.stride_ptr();
  v.dtype = a.dtype();
  v.device_type = a.device_type();
  v.device_id = a.device_id();
  v.present = true;
  return v;
}
template <class A>
View view(const char* name, const std::optional<A>& a) {
  return a ? view(name, *a) : View{name};
}

[[noreturn]] void value_error(const std::string& msg) { throw nb::value_error(msg.c_str()); }
[[noreturn]] void type_error(const std::string& msg) { throw nb::type_error(msg.c_str()); }

std::string shape_str(const View& v) {
  std::string s = "(";
  for (int64_t i = 0; i < v.ndim; ++i) s += (i ? ", " : "") + std::to_string(v.shape[i]);
  return s + (v.ndim == 1 ? ",)" : ")");
}

std::string dtype_str(nb::dlpack::dtype t) {
  using C = nb::dlpack::dtype_code;
  const char* kind = "?";
  switch (static_cast<C>(t.code)) {
    case C::Int: kind = "int"; break;
    case C::UInt: kind = "uint"; break;
    case C::Float: kind = "float"; break;
    case C::Bfloat: kind = "bfloat"; break;
    case C::Complex: kind = "complex"; break;
    case C::Bool: kind = "bool"; break;
    default: return "DLPack dtype code " + std::to_string(t.code) + " with " + std::to_string(t.bits) + " bits";
  }
  return std::string(kind) + std::to_string(t.bits);
}

bool is(nb::dlpack::dtype t, nb::dlpack::dtype_code code, int bits) {
  return t.code == static_cast<uint8_t>(code) && t.bits == bits && t.lanes == 1;
}

// Storage dtype of q, k, v and friends. A uint16 array is a bfloat16 one reinterpreted by the Python
// layer when bf16_as_u16 is set (NumPy cannot export ml_dtypes.bfloat16 through DLPack).
fa::DType storage_dtype(const View& v, bool bf16_as_u16) {
  using C = nb::dlpack::dtype_code;
  if (is(v.dtype, C::Float, 32)) return fa::DType::kFloat32;
  if (is(v.dtype, C::Float, 16)) return fa::DType::kFloat16;
  if (is(v.dtype, C::Bfloat, 16) || (bf16_as_u16 && is(v.dtype, C::UInt, 16))) return fa::DType::kBFloat16;
  type_error(std::string(v.name) + ": expected float32, float16 or bfloat16, got " + dtype_str(v.dtype));
}

constexpr int kCpu = static_cast<int>(nb::device::cpu::value);
constexpr int kCudaHost = static_cast<int>(nb::device::cuda_host::value);
constexpr int kCuda = static_cast<int>(nb::device::cuda::value);
constexpr int kCudaManaged = static_cast<int>(nb::device::cuda_managed::value);

bool host_readable(int device_type) { return device_type == kCpu || device_type == kCudaHost; }

std::string device_str(const View& v) {
  if (host_readable(v.device_type)) return "cpu";
  if (v.device_type == kCuda || v.device_type == kCudaManaged) return "cuda:" + std::to_string(v.device_id);
  return "DLPack device type " + std::to_string(v.device_type) + ":" + std::to_string(v.device_id);
}

void check_same_device(const View& q, const View& a) {
  if (!a.present) return;
  const bool same = host_readable(q.device_type) ? host_readable(a.device_type)
                                                 : (a.device_type == q.device_type && a.device_id == q.device_id);
  if (!same)
    value_error(std::string(a.name) + ": expected an array on " + device_str(q) + " (where " + q.name + " is), got " +
                device_str(a));
}

void check_ndim(const View& v, int64_t ndim, const char* layout) {
  if (v.ndim != ndim)
    value_error(std::string(v.name) + ": expected " + std::to_string(ndim) + " dimensions " + layout + ", got shape " +
                shape_str(v));
}

void check_dim(const View& v, int64_t i, int64_t expected, const char* what) {
  if (v.size(i) != expected)
    value_error(std::string(v.name) + ": expected " + what + " = " + std::to_string(expected) + " (dimension " +
                std::to_string(i) + "), got shape " + shape_str(v));
}

void check_last_contiguous(const View& v) {
  if (v.size(-1) > 1 && v.stride(-1) != 1)
    value_error(std::string(v.name) + ": the last dimension must be contiguous (stride 1), got stride " +
                std::to_string(v.stride(-1)));
}

// [batch, seqlen, heads, dim] (or [total, heads, dim] for varlen) to the C++ strided view.
fa::ConstTensor bshd(const View& v, bool varlen) {
  check_last_contiguous(v);
  if (varlen) return {v.data, 0, v.stride(0), v.stride(1)};
  return {v.data, v.stride(0), v.stride(1), v.stride(2)};
}
fa::Tensor bshd_out(const View& v, bool varlen) {
  const fa::ConstTensor t = bshd(v, varlen);
  return {const_cast<void*>(t.data), t.batch_stride, t.row_stride, t.head_stride};
}

// Strides of an array broadcastable to [batch, heads, seqlen_q, seqlen_k]: missing leading dimensions
// and size-1 dimensions broadcast through stride 0. The last dimension must be real and contiguous;
// the Python layer materialises a broadcast one.
struct Broadcast4 {
  int64_t batch = 0, head = 0, row = 0;
};
Broadcast4 broadcast4(const View& v, const int64_t (&target)[4]) {
  if (v.ndim < 1 || v.ndim > 4)
    value_error(std::string(v.name) + ": expected 1 to 4 dimensions broadcastable to [batch, heads, seqlen_q, seqlen_k], "
                "got shape " + shape_str(v));
  int64_t strides[4] = {0, 0, 0, 0};
  for (int64_t i = 0; i < v.ndim; ++i) {
    const int64_t d = 4 - v.ndim + i;
    const int64_t n = v.shape[i];
    if (n == target[d]) strides[d] = n == 1 ? 0 : v.strides[i];
    else if (n == 1) strides[d] = 0;
    else
      value_error(std::string(v.name) + ": shape " + shape_str(v) + " does not broadcast to [batch, heads, seqlen_q, seqlen_k] = (" +
                  std::to_string(target[0]) + ", " + std::to_string(target[1]) + ", " + std::to_string(target[2]) +
                  ", " + std::to_string(target[3]) + ")");
  }
  if (target[3] > 1 && strides[3] != 1)
    value_error(std::string(v.name) + ": the last (seqlen_k) dimension must be contiguous, got stride " +
                std::to_string(strides[3]));
  return {strides[0], strides[1], strides[2]};
}

// The C++ message starts with the C++ field it blames; prefix the Python argument it came from.
std::string python_argument(std::string_view msg) {
  static constexpr std::pair<std::string_view, std::string_view> kNames[] = {
      {"maybe_cu_seqlens_q", "cu_seqlens_q"}, {"maybe_cu_seqlens_k", "cu_seqlens_k"},
      {"maybe_alibi_slopes", "alibi_slopes"}, {"alibi_batch_stride", "alibi_slopes"},
      {"maybe_bias", "bias"},                 {"maybe_mask", "mask"},
      {"maybe_lse", "lse"},                   {"softmax_scale", "scale"},
      {"alignment", "causal_alignment"},      {"window_left", "window"},
      {"window_right", "window"},             {"head_dim_v", "v"},
      {"head_dim", "q, k"},                   {"heads_q", "q"},
      {"heads_kv", "k"},                      {"seqlen_q", "q"},
      {"seqlen_k", "k"},                      {"batch", "q"},
      {"d_o", "grad_out"},                    {"dtype", "q"},
      {"launch.backend", "backend"},          {"backward", "backend"},
  };
  for (const auto& [cpp, py] : kNames)
    if (msg.substr(0, cpp.size()) == cpp) return std::string(py);
  const std::string_view field = msg.substr(0, msg.find_first_of(":[ "));
  if (field == "o") return "out";
  return std::string(field);  // q, k, v, lse, dq, dk, dv: the same name in Python
}

void raise_status(const fa::Status& s) {
  const std::string msg = python_argument(s.message) + ": " + s.message;
  if (s.code == fa::StatusCode::kInternal) throw std::runtime_error(msg);
  value_error(msg);
}

struct Options {
  float scale;
  bool causal;
  int alignment;
  int64_t window_left, window_right;
  float softcap;
};

// Shapes, dtypes, devices and the shared AttentionParams. Returns whether the problem is varlen.
bool fill_attention(fa::AttentionParams& p, const View& q, const View& k, const View& v, const View& bias,
                    const View& mask, const View& alibi, const View& cu_q, const View& cu_k, int64_t max_seqlen_q,
                    int64_t max_seqlen_k, const Options& opt, bool bf16_as_u16) {
  const bool varlen = cu_q.present || cu_k.present;
  if (varlen && !(cu_q.present && cu_k.present))
    value_error("cu_seqlens_q, cu_seqlens_k: give both (variable-length batch) or neither");
  const char* layout = varlen ? "[total, heads, head_dim]" : "[batch, seqlen, heads, head_dim]";
  const int64_t nd = varlen ? 3 : 4;
  for (const View* t : {&q, &k, &v}) check_ndim(*t, nd, layout);
  for (const View* t : {&k, &v, &bias, &mask, &alibi, &cu_q, &cu_k}) check_same_device(q, *t);
  if (!host_readable(q.device_type) && q.device_type != kCuda && q.device_type != kCudaManaged)
    value_error(std::string("q: arrays on ") + device_str(q) + " are not supported (CPU or CUDA)");

  p.dtype = storage_dtype(q, bf16_as_u16);
  for (const View* t : {&k, &v})
    if (t->dtype != q.dtype)
      type_error(std::string(t->name) + ": expected the dtype of q (" + dtype_str(q.dtype) + "), got " + dtype_str(t->dtype));

  const int64_t h = nd - 2;  // heads dimension
  if (varlen) {
    for (const View* c : {&cu_q, &cu_k}) {
      if (!is(c->dtype, nb::dlpack::dtype_code::Int, 32)) type_error(std::string(c->name) + ": expected int32, got " + dtype_str(c->dtype));
      check_ndim(*c, 1, "[batch + 1]");
      if (c->size(0) < 1) value_error(std::string(c->name) + ": expected at least one entry (batch + 1)");
      if (c->stride(0) != 1 && c->size(0) > 1) value_error(std::string(c->name) + ": expected a contiguous array");
    }
    if (cu_k.size(0) != cu_q.size(0))
      value_error("cu_seqlens_k: expected " + std::to_string(cu_q.size(0)) + " entries like cu_seqlens_q, got " +
                  std::to_string(cu_k.size(0)));
    p.batch = cu_q.size(0) - 1;
    p.seqlen_q = max_seqlen_q;
    p.seqlen_k = max_seqlen_k;
    p.maybe_cu_seqlens_q = static_cast<const int32_t*>(cu_q.data);
    p.maybe_cu_seqlens_k = static_cast<const int32_t*>(cu_k.data);
    check_dim(v, 0, k.size(0), "total_k (rows of k)");
  } else {
    p.batch = q.size(0);
    p.seqlen_q = q.size(1);
    p.seqlen_k = k.size(1);
    check_dim(k, 0, p.batch, "batch (of q)");
    check_dim(v, 0, p.batch, "batch (of q)");
    check_dim(v, 1, p.seqlen_k, "seqlen_k (of k)");
  }
  p.heads_q = q.size(h);
  p.heads_kv = k.size(h);
  p.head_dim = q.size(-1);
  p.head_dim_v = v.size(-1);
  check_dim(v, h, p.heads_kv, "heads_kv (of k)");
  check_dim(k, -1 + nd, p.head_dim, "head_dim (of q)");
  if (p.heads_kv == 0 || p.heads_q % p.heads_kv != 0)
    value_error("k: heads_q = " + std::to_string(p.heads_q) + " must be a multiple of heads_kv = " + std::to_string(p.heads_kv));
  p.q = bshd(q, varlen);
  p.k = bshd(k, varlen);
  p.v = bshd(v, varlen);

  p.softmax_scale = opt.scale;
  p.causal = opt.causal;
  p.alignment = static_cast<fa::Alignment>(opt.alignment);
  p.window_left = opt.window_left;
  p.window_right = opt.window_right;
  p.softcap = opt.softcap;

  if (alibi.present) {
    if (!is(alibi.dtype, nb::dlpack::dtype_code::Float, 32))
      type_error(std::string("alibi_slopes: expected float32, got ") + dtype_str(alibi.dtype));
    if (alibi.ndim == 1) {
      check_dim(alibi, 0, p.heads_q, "heads (of q)");
      p.alibi_batch_stride = 0;
    } else if (alibi.ndim == 2) {
      if (alibi.size(0) != p.batch && alibi.size(0) != 1) check_dim(alibi, 0, p.batch, "batch");
      check_dim(alibi, 1, p.heads_q, "heads (of q)");
      p.alibi_batch_stride = alibi.size(0) == 1 ? 0 : alibi.stride(0);
    } else {
      value_error("alibi_slopes: expected shape [heads] or [batch, heads], got " + shape_str(alibi));
    }
    check_last_contiguous(alibi);
    p.maybe_alibi_slopes = static_cast<const float*>(alibi.data);
  }

  const int64_t target[4] = {p.batch, p.heads_q, p.seqlen_q, p.seqlen_k};
  if (bias.present) {
    if (varlen) value_error("bias: not supported with a variable-length batch");
    using C = nb::dlpack::dtype_code;
    fa::DType t;
    if (is(bias.dtype, C::Float, 32)) t = fa::DType::kFloat32;
    else if (is(bias.dtype, C::Float, 16)) t = fa::DType::kFloat16;
    else if (is(bias.dtype, C::Bfloat, 16) || (bf16_as_u16 && is(bias.dtype, C::UInt, 16))) t = fa::DType::kBFloat16;
    else type_error("bias: expected float32, float16 or bfloat16, got " + dtype_str(bias.dtype));
    const Broadcast4 s = broadcast4(bias, target);
    p.maybe_bias = {bias.data, t, s.batch, s.head, s.row};
  }
  if (mask.present) {
    if (varlen) value_error("mask: not supported with a variable-length batch");
    using C = nb::dlpack::dtype_code;
    if (!is(mask.dtype, C::Bool, 8) && !is(mask.dtype, C::UInt, 8) && !is(mask.dtype, C::Int, 8))
      type_error("mask: expected bool (True = attend) or uint8, got " + dtype_str(mask.dtype));
    const Broadcast4 s = broadcast4(mask, target);
    p.maybe_mask = {static_cast<const uint8_t*>(mask.data), s.batch, s.head, s.row};
  }
  return varlen;
}

bool gpu_backend(fa::Backend b) { return b == fa::Backend::kCudaSm80 || b == fa::Backend::kCudaSm90; }

fa::Launch make_launch(const View& q, int backend, uintptr_t stream, const View& workspace, int num_threads) {
  fa::Launch l;
  l.backend = static_cast<fa::Backend>(backend);
  // Host arrays never reach a GPU backend, nor device arrays a CPU one; kAuto on device arrays stays
  // kAuto, so the library's selection picks the fastest GPU path that takes the problem.
  const bool on_host = host_readable(q.device_type);
  if (l.backend == fa::Backend::kAuto && on_host)
    l.backend = fa::Backend::kCpu;
  else if (!on_host && l.backend != fa::Backend::kAuto && !gpu_backend(l.backend))
    value_error(std::string("backend: ") + fa::to_string(l.backend) + " runs on the CPU, but q is on " + device_str(q));
  else if (on_host && gpu_backend(l.backend))
    value_error(std::string("backend: ") + fa::to_string(l.backend) + " needs arrays on a CUDA device, but q is on the CPU");
  l.num_threads = num_threads;
  l.stream = reinterpret_cast<void*>(stream);
  if (workspace.present) {
    l.workspace = const_cast<void*>(workspace.data);
    l.workspace_bytes = 1;
    for (int64_t i = 0; i < workspace.ndim; ++i) l.workspace_bytes *= static_cast<size_t>(workspace.shape[i]);
    l.workspace_bytes *= (workspace.dtype.bits + 7) / 8;
  }
  return l;
}

// Runs op(params, launch) without the GIL. A GPU backend needs caller-owned workspace: when it is
// missing or too small, nothing runs and the byte count is returned so the caller can allocate it.
// The run is tried first and the size asked only when it fails (the GPU forward mostly needs none): one
// pass through the selection point's checks per call instead of two, which a tiny call notices.
template <class Params, class SizeFn, class RunFn>
int64_t run(const Params& p, const fa::Launch& l, SizeFn size_fn, RunFn run_fn) {
  fa::Status s;
  {
    nb::gil_scoped_release release;
    s = run_fn(p, l);
  }
  if (!s && (gpu_backend(l.backend) || l.backend == fa::Backend::kAuto)) {  // kAuto here: device arrays
    size_t need = 0;
    if (size_fn(p, l, &need) && need > 0 && (l.workspace == nullptr || l.workspace_bytes < need))
      return static_cast<int64_t>(need);
  }
  if (!s) raise_status(s);
  return 0;
}

// The forward on views: fills ForwardParams, checks out and lse, runs (or asks for workspace).
// The log-sum-exp array of forward (output) and backward (input): float32, [batch, heads, seqlen_q]
// or, with varlen, [heads, total_q]; fills the strides the C++ API takes.
void check_lse(const View& lse, const fa::AttentionParams& p, const View& q, bool varlen, int64_t* batch_stride,
               int64_t* head_stride) {
  if (!is(lse.dtype, nb::dlpack::dtype_code::Float, 32)) type_error("lse: expected float32, got " + dtype_str(lse.dtype));
  if (varlen) {
    check_ndim(lse, 2, "[heads, total_q]");
    check_dim(lse, 0, p.heads_q, "heads_q");
    check_dim(lse, 1, q.size(0), "total_q");
    *head_stride = lse.stride(0);
  } else {
    check_ndim(lse, 3, "[batch, heads, seqlen_q]");
    check_dim(lse, 0, p.batch, "batch");
    check_dim(lse, 1, p.heads_q, "heads_q");
    check_dim(lse, 2, p.seqlen_q, "seqlen_q");
    *batch_stride = lse.stride(0);
    *head_stride = lse.stride(1);
  }
  check_last_contiguous(lse);
}

int64_t forward_views(const View& q, const View& k, const View& v, const View& o, const View& lse, const View& bias,
                      const View& mask, const View& alibi, const View& cu_q, const View& cu_k, int64_t max_seqlen_q,
                      int64_t max_seqlen_k, const Options& opt, int backend, uintptr_t stream, const View& ws,
                      int num_threads, bool bf16_as_u16) {
  fa::ForwardParams p;
  const bool varlen = fill_attention(p, q, k, v, bias, mask, alibi, cu_q, cu_k, max_seqlen_q, max_seqlen_k, opt,
                                     bf16_as_u16);
  check_same_device(q, o);
  check_same_device(q, lse);
  check_ndim(o, q.ndim, "like q");
  for (int64_t i = 0; i + 1 < q.ndim; ++i) check_dim(o, i, q.size(i), "the size of q");
  check_dim(o, -1 + q.ndim, p.head_dim_v, "head_dim_v (of v)");
  if (o.dtype != q.dtype)
    type_error("out: expected the dtype of q (" + dtype_str(q.dtype) + "), got " + dtype_str(o.dtype));
  p.o = bshd_out(o, varlen);
  if (lse.present) {
    check_lse(lse, p, q, varlen, &p.lse_batch_stride, &p.lse_head_stride);
    p.maybe_lse = static_cast<float*>(const_cast<void*>(lse.data));
  }
  const fa::Launch l = make_launch(q, backend, stream, ws, num_threads);
  return run(p, l, [](const auto& pp, const auto& ll, size_t* b) { return fa::forward_workspace_size(pp, ll, b); },
             [](const auto& pp, const auto& ll) { return fa::forward(pp, ll); });
}

int64_t forward(InArray q_, InArray k_, InArray v_, OutArray o_, std::optional<OutArray> lse_,
                std::optional<InArray> bias_, std::optional<InArray> mask_, std::optional<InArray> alibi_,
                std::optional<InArray> cu_q_, std::optional<InArray> cu_k_, int64_t max_seqlen_q,
                int64_t max_seqlen_k, float scale, bool causal, int alignment, int64_t window_left,
                int64_t window_right, float softcap, int backend, uintptr_t stream,
                std::optional<OutArray> workspace_, int num_threads, bool bf16_as_u16) {
  return forward_views(view("q", q_), view("k", k_), view("v", v_), view("out", o_), view("lse", lse_),
                       view("bias", bias_), view("mask", mask_), view("alibi_slopes", alibi_),
                       view("cu_seqlens_q", cu_q_), view("cu_seqlens_k", cu_k_), max_seqlen_q, max_seqlen_k,
                       {scale, causal, alignment, window_left, window_right, softcap}, backend, stream,
                       view("workspace", workspace_), num_threads, bf16_as_u16);
}

// A strided array described by ints: what a framework's tensor says of itself (data_ptr, shape,
// strides in elements, dtype, device), without the cost of a DLPack export and import per call.
struct RawArray {
  int64_t ndim = 0;
  int64_t shape[4] = {};
  int64_t strides[4] = {};
};

RawArray raw_array(const char* name, const nb::tuple& shape, const nb::tuple& strides) {
  RawArray r;
  r.ndim = static_cast<int64_t>(nb::len(shape));
  if (r.ndim > 4 || static_cast<int64_t>(nb::len(strides)) != r.ndim)
    value_error(std::string(name) + ": expected at most 4 dimensions with one stride each");
  size_t i = 0;
  for (nb::handle n : shape) r.shape[i++] = nb::cast<int64_t>(n);
  i = 0;
  for (nb::handle n : strides) r.strides[i++] = nb::cast<int64_t>(n);
  return r;
}

nb::dlpack::dtype raw_dtype(int dtype) {
  using C = nb::dlpack::dtype_code;
  switch (dtype) {
    case static_cast<int>(fa::DType::kFloat32): return {static_cast<uint8_t>(C::Float), 32, 1};
    case static_cast<int>(fa::DType::kFloat16): return {static_cast<uint8_t>(C::Float), 16, 1};
    case static_cast<int>(fa::DType::kBFloat16): return {static_cast<uint8_t>(C::Bfloat), 16, 1};
  }
  type_error("dtype: expected 0 (float32), 1 (float16) or 2 (bfloat16), got " + std::to_string(dtype));
}

View raw_view(const char* name, uintptr_t ptr, const RawArray& r, nb::dlpack::dtype t, int device) {
  View v;
  v.name = name;
  v.data = reinterpret_cast<const void*>(ptr);
  v.ndim = r.ndim;
  v.shape = r.shape;
  v.strides = r.strides;
  v.dtype = t;
  v.device_type = device < 0 ? kCpu : kCuda;
  v.device_id = device < 0 ? 0 : device;
  v.present = true;
  return v;
}

// Forward of a plain problem (no bias, mask, ALiBi or varlen) from raw tensor descriptions: the
// per-call fast path of flashattn.torch. The caller vouches that each pointer holds an array of the
// given shape, strides, dtype and device (-1: CPU, else the CUDA device index), that out has q's
// shape with v's head_dim, and that lse (0: none) is a contiguous float32 [batch, heads, seqlen_q];
// all else is checked here as in forward().
int64_t forward_raw(int dtype, uintptr_t q_ptr, const nb::tuple& q_shape, const nb::tuple& q_strides, int q_device,
                    uintptr_t k_ptr, const nb::tuple& k_shape, const nb::tuple& k_strides, int k_device,
                    uintptr_t v_ptr, const nb::tuple& v_shape, const nb::tuple& v_strides, int v_device,
                    uintptr_t o_ptr, const nb::tuple& o_strides, uintptr_t lse_ptr, float scale, bool causal,
                    int alignment, int64_t window_left, int64_t window_right, float softcap, uintptr_t stream,
                    uintptr_t workspace_ptr, int64_t workspace_bytes) {
  const nb::dlpack::dtype t = raw_dtype(dtype);
  const RawArray qa = raw_array("q", q_shape, q_strides), ka = raw_array("k", k_shape, k_strides),
                 va = raw_array("v", v_shape, v_strides);
  const View q = raw_view("q", q_ptr, qa, t, q_device), k = raw_view("k", k_ptr, ka, t, k_device),
             v = raw_view("v", v_ptr, va, t, v_device);
  for (const View* x : {&q, &v}) check_ndim(*x, 4, "[batch, seqlen, heads, head_dim]");
  RawArray oa = raw_array("out", q_shape, o_strides);
  oa.shape[3] = va.shape[3];
  const View o = raw_view("out", o_ptr, oa, t, q_device);
  View lse{"lse"};
  RawArray la;
  if (lse_ptr != 0) {
    la.ndim = 3;
    la.shape[0] = qa.shape[0], la.shape[1] = qa.shape[2], la.shape[2] = qa.shape[1];
    la.strides[0] = qa.shape[2] * qa.shape[1], la.strides[1] = qa.shape[1], la.strides[2] = 1;
    lse = raw_view("lse", lse_ptr, la, {static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 32, 1}, q_device);
  }
  View ws{"workspace"};
  RawArray wa;
  if (workspace_ptr != 0) {
    wa.ndim = 1, wa.shape[0] = workspace_bytes, wa.strides[0] = 1;
    ws = raw_view("workspace", workspace_ptr, wa, {static_cast<uint8_t>(nb::dlpack::dtype_code::UInt), 8, 1},
                  q_device);
  }
  const View none[] = {View{"bias"}, View{"mask"}, View{"alibi_slopes"}, View{"cu_seqlens_q"}, View{"cu_seqlens_k"}};
  return forward_views(q, k, v, o, lse, none[0], none[1], none[2], none[3], none[4], 0, 0,
                       {scale, causal, alignment, window_left, window_right, softcap}, /*backend=*/0, stream, ws,
                       /*num_threads=*/0, /*bf16_as_u16=*/false);
}

int64_t backward(InArray do_, InArray q_, InArray k_, InArray v_, InArray o_, InArray lse_, OutArray dq_,
                 OutArray dk_, OutArray dv_, std::optional<InArray> bias_, std::optional<InArray> mask_,
                 std::optional<InArray> alibi_, std::optional<InArray> cu_q_, std::optional<InArray> cu_k_,
                 int64_t max_seqlen_q, int64_t max_seqlen_k, float scale, bool causal, int alignment,
                 int64_t window_left, int64_t window_right, float softcap, int backend, uintptr_t stream,
                 std::optional<OutArray> workspace_, int num_threads, bool bf16_as_u16, bool deterministic) {
  const View q = view("q", q_), k = view("k", k_), v = view("v", v_), o = view("out", o_), d_o = view("grad_out", do_),
             lse = view("lse", lse_), dq = view("dq", dq_), dk = view("dk", dk_), dv = view("dv", dv_);
  fa::BackwardParams p;
  const bool varlen = fill_attention(p, q, k, v, view("bias", bias_), view("mask", mask_), view("alibi_slopes", alibi_),
                                     view("cu_seqlens_q", cu_q_), view("cu_seqlens_k", cu_k_), max_seqlen_q, max_seqlen_k,
                                     {scale, causal, alignment, window_left, window_right, softcap}, bf16_as_u16);
  // (tensor, like, last dim) : out and grad_out are shaped like q with v's head_dim; gradients like their inputs.
  const std::pair<const View*, const View*> like[] = {{&o, &q}, {&d_o, &q}, {&dq, &q}, {&dk, &k}, {&dv, &v}};
  for (const auto& [t, ref] : like) {
    check_same_device(q, *t);
    check_ndim(*t, q.ndim, "like q");
    const int64_t last = (t == &o || t == &d_o) ? p.head_dim_v : ref->size(-1);
    for (int64_t i = 0; i + 1 < q.ndim; ++i) check_dim(*t, i, ref->size(i), ref == &q ? "the size of q" : "its input's size");
    check_dim(*t, q.ndim - 1, last, (t == &o || t == &d_o || t == &dv) ? "head_dim_v" : "head_dim");
    if (t->dtype != q.dtype)
      type_error(std::string(t->name) + ": expected the dtype of q (" + dtype_str(q.dtype) + "), got " + dtype_str(t->dtype));
  }
  p.o = bshd(o, varlen);
  p.d_o = bshd(d_o, varlen);
  p.dq = bshd_out(dq, varlen);
  p.dk = bshd_out(dk, varlen);
  p.dv = bshd_out(dv, varlen);
  check_same_device(q, lse);
  check_lse(lse, p, q, varlen, &p.lse_batch_stride, &p.lse_head_stride);
  p.lse = static_cast<const float*>(lse.data);
  p.deterministic = deterministic;
  const View ws = view("workspace", workspace_);
  const fa::Launch l = make_launch(q, backend, stream, ws, num_threads);
  return run(p, l, [](const auto& pp, const auto& ll, size_t* b) { return fa::backward_workspace_size(pp, ll, b); },
             [](const auto& pp, const auto& ll) { return fa::backward(pp, ll); });
}

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "flashattn C++ core (internal; use the flashattn package)";
  const char* fwd_doc =
      "forward(q, k, v, out, lse, bias, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, "
      "max_seqlen_k, scale, causal, alignment, window_left, window_right, softcap, backend, stream, workspace, "
      "num_threads, bf16_as_u16) -> int\n\nWrites out (and lse). Returns 0, or the bytes of device workspace "
      "needed when a GPU backend was given none or too little (then nothing ran).";
  m.def("forward", &forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(),
        nb::arg("bias").none(), nb::arg("mask").none(), nb::arg("alibi_slopes").none(), nb::arg("cu_seqlens_q").none(),
        nb::arg("cu_seqlens_k").none(), nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"), nb::arg("scale"),
        nb::arg("causal"), nb::arg("alignment"), nb::arg("window_left"), nb::arg("window_right"), nb::arg("softcap"),
        nb::arg("backend"), nb::arg("stream"), nb::arg("workspace").none(), nb::arg("num_threads"),
        nb::arg("bf16_as_u16"), fwd_doc);
  m.def("forward_raw", &forward_raw,
        "forward_raw(dtype, q_ptr, q_shape, q_strides, q_device, k_ptr, ..., v_ptr, ..., out_ptr, out_strides, "
        "lse_ptr, scale, causal, alignment, window_left, window_right, softcap, stream, workspace_ptr, "
        "workspace_bytes) -> int\n\nforward() of a plain problem from raw tensor descriptions (dtype 0/1/2: "
        "float32/float16/bfloat16; device -1: CPU, else the CUDA index); the caller vouches for the memory.");
  m.def("backward", &backward, nb::arg("grad_out"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("bias").none(), nb::arg("mask").none(),
        nb::arg("alibi_slopes").none(), nb::arg("cu_seqlens_q").none(), nb::arg("cu_seqlens_k").none(),
        nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"), nb::arg("scale"), nb::arg("causal"), nb::arg("alignment"),
        nb::arg("window_left"), nb::arg("window_right"), nb::arg("softcap"), nb::arg("backend"), nb::arg("stream"),
        nb::arg("workspace").none(), nb::arg("num_threads"), nb::arg("bf16_as_u16"), nb::arg("deterministic"),
        "backward(...) -> int: writes dq, dk, dv; returns 0 or the device workspace bytes needed (see forward). "
        "deterministic: dq bit-identical across runs on the GPU (BackwardParams::deterministic).");
  m.attr("BACKENDS") = nb::make_tuple("auto", "cpu", "reference", "standard", "cuda-sm80", "cuda-sm90");
#ifdef FLASHATTN_PY_CUDA
  m.attr("HAS_CUDA") = true;
#else
  m.attr("HAS_CUDA") = false;
#endif
}
