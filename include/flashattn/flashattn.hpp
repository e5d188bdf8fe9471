// flashattn: exact attention computed the FlashAttention way.
//
//   O = softmax(mask(softcap(scale · Q·Kᵀ) + alibi + bias)) · V
//
// The C++ API is framework-free: plain structs of raw pointers and int64_t element strides,
// caller-owned outputs and workspace, no hidden global state. Every entry point returns a
// Status; on error nothing is written and the message names the argument at fault.
//
// Layouts (element strides; the last dimension is always contiguous):
//   q    [batch, seqlen_q, heads_q,  head_dim]
//   k    [batch, seqlen_k, heads_kv, head_dim]
//   v    [batch, seqlen_k, heads_kv, head_dim_v]
//   o    [batch, seqlen_q, heads_q,  head_dim_v]
//   lse  [batch, heads_q, seqlen_q]   fp32, natural log, row dimension contiguous
// With variable-length batches (maybe_cu_seqlens_q/k set) the batch dimension is folded into the
// row dimension: q is [total_q, heads_q, head_dim] and sequence b owns rows
// cu_seqlens_q[b] .. cu_seqlens_q[b+1]; batch strides are ignored, and lse is [heads_q, total_q].
//
// Causal alignment (which diagonal "causal", the sliding window and ALiBi measure from), for
// seqlen_q = 3, seqlen_k = 5 (x = visible):
//
//   kBottomRight (flash-attn >= 2.1)      kTopLeft (PyTorch is_causal)
//   query i sees key j <= i + Sk - Sq      query i sees key j <= i
//        k: 0 1 2 3 4                          k: 0 1 2 3 4
//     q0:   x x x . .                       q0:   x . . . .
//     q1:   x x x x .                       q1:   x x . . .
//     q2:   x x x x x                       q2:   x x x . .
//
// A query row that sees no key gets O = 0 and LSE = -inf (never NaN).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace flashattn {

// Storage type of q, k, v, o (and do, dq, dk, dv); arithmetic is always fp32 or wider.
enum class DType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Which diagonal "causal", the window and ALiBi distances are measured from (picture above).
enum class Alignment : int32_t { kBottomRight = 0, kTopLeft = 1 };

// Which implementation runs. kAuto picks the fastest that supports the problem: in a CUDA build,
// the GPU path when q is device memory, else the CPU. The reference (fp64 textbook attention) and
// standard (fp32, S and P materialised) backends are exact CPU baselines for tests and benchmarks.
// kCudaSm80: FlashAttention-2-class tensor-core kernels for compute capability >= 8.0 (fp16/bf16;
// forward and backward with every option: see README). Its backward accumulates dQ with
// fp32 atomics by default, and the key blocks of a split last wave add dK and dV the same way, so
// these may differ in the last bits between runs; BackwardParams::deterministic computes dQ without
// atomics and splits no block, bit-identical from run to run.
// kCudaSm90: the Hopper forward (compute capability 9.0; TMA, wgmma, warp-specialised) for the
// problems it takes (see README); kAuto picks it on sm_90 when it does, else kCudaSm80. It has no
// backward: backward() with kCudaSm90 is refused, and kAuto's backward is kCudaSm80's.
enum class Backend : int32_t { kAuto = 0, kCpu = 1, kReference = 2, kStandard = 3, kCudaSm80 = 4, kCudaSm90 = 5 };

enum class StatusCode : int32_t {
  kOk = 0,
  kInvalidArgument = 1,  // a pointer, size, stride or option is wrong
  kNotSupported = 2,     // valid, but the selected backend does not take it
  kWorkspaceTooSmall = 3,
  kInternal = 4,
};

struct Status {
  StatusCode code = StatusCode::kOk;
  std::string message;  // names the argument and what was expected
  bool ok() const { return code == StatusCode::kOk; }
  explicit operator bool() const { return ok(); }
};

// A strided [batch, seqlen, heads, dim] view; strides are in elements, dim is contiguous.
struct ConstTensor {
  const void* data = nullptr;
  int64_t batch_stride = 0;
  int64_t row_stride = 0;
  int64_t head_stride = 0;
};
struct Tensor {
  void* data = nullptr;
  int64_t batch_stride = 0;
  int64_t row_stride = 0;
  int64_t head_stride = 0;
  operator ConstTensor() const { return {data, batch_stride, row_stride, head_stride}; }
};

// Contiguous [batch, seqlen, heads, dim] (for varlen, [total, heads, dim]) strides.
inline ConstTensor contiguous(const void* data, int64_t seqlen, int64_t heads, int64_t dim) {
  return {data, seqlen * heads * dim, heads * dim, dim};
}
inline Tensor contiguous(void* data, int64_t seqlen, int64_t heads, int64_t dim) {
  return {data, seqlen * heads * dim, heads * dim, dim};
}

// Additive bias [batch, heads_q, seqlen_q, seqlen_k], added to the (soft-capped) scaled scores.
// Zero strides broadcast (e.g. batch_stride = head_stride = 0 for one [Sq, Sk] bias).
struct BiasRef {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t batch_stride = 0;
  int64_t head_stride = 0;
  int64_t row_stride = 0;  // stride over seqlen_q; seqlen_k is contiguous
};

// Boolean mask [batch, heads_q, seqlen_q, seqlen_k], one byte per element, nonzero = attend.
// Zero strides broadcast (a key-padding mask is [batch, 1, 1, seqlen_k]: head and row stride 0).
// Key tiles whose mask is all zero are skipped, so block-sparse masks cost what they keep.
struct MaskRef {
  const uint8_t* data = nullptr;
  int64_t batch_stride = 0;
  int64_t head_stride = 0;
  int64_t row_stride = 0;
};

// What every attention operation shares: shapes, inputs and score modifiers.
struct AttentionParams {
  DType dtype = DType::kFloat32;

  int64_t batch = 0;
  int64_t seqlen_q = 0;   // with varlen: the maximum length (an upper bound) over the batch
  int64_t seqlen_k = 0;   // with varlen: the maximum length (an upper bound) over the batch
  int64_t heads_q = 0;
  int64_t heads_kv = 0;   // heads_q % heads_kv == 0 (GQA / MQA)
  int64_t head_dim = 0;   // of q and k
  int64_t head_dim_v = 0; // of v and o; 0 means head_dim

  ConstTensor q;
  ConstTensor k;
  ConstTensor v;

  // Variable-length batches: int32 [batch + 1], non-decreasing, starting at 0. Both or neither.
  const int32_t* maybe_cu_seqlens_q = nullptr;
  const int32_t* maybe_cu_seqlens_k = nullptr;

  float softmax_scale = 0.0f;  // 0 means 1/sqrt(head_dim)
  bool causal = false;         // same as window_right = 0
  Alignment alignment = Alignment::kBottomRight;
  int64_t window_left = -1;    // keys more than window_left before the diagonal are hidden; -1 = unbounded
  int64_t window_right = -1;   // keys more than window_right after the diagonal are hidden; -1 = unbounded
  float softcap = 0.0f;        // > 0: s -> softcap * tanh(s / softcap), applied before ALiBi and bias

  // ALiBi: score -= slope * |i + diagonal_offset - j|; slope = slopes[b * alibi_batch_stride + h].
  // alibi_batch_stride = 0 for [heads_q] slopes, heads_q for [batch, heads_q].
  const float* maybe_alibi_slopes = nullptr;
  int64_t alibi_batch_stride = 0;

  BiasRef maybe_bias;  // data == nullptr: none
  MaskRef maybe_mask;  // data == nullptr: none
};

struct ForwardParams : AttentionParams {
  Tensor o;                        // [batch, seqlen_q, heads_q, head_dim_v]
  float* maybe_lse = nullptr;      // [batch, heads_q, seqlen_q] (varlen: [heads_q, total_q])
  int64_t lse_batch_stride = 0;
  int64_t lse_head_stride = 0;
};

// Gradients of the forward above. P is recomputed tile by tile from q, k and lse.
// Bias, mask and ALiBi slopes get no gradient.
struct BackwardParams : AttentionParams {
  ConstTensor o;                   // forward output  [batch, seqlen_q, heads_q, head_dim_v]
  ConstTensor d_o;                 // dLoss/dO        [batch, seqlen_q, heads_q, head_dim_v]
  const float* lse = nullptr;      // forward LSE, same layout as ForwardParams::maybe_lse
  int64_t lse_batch_stride = 0;
  int64_t lse_head_stride = 0;
  Tensor dq;                       // [batch, seqlen_q, heads_q, head_dim]
  Tensor dk;                       // [batch, seqlen_k, heads_kv, head_dim]
  Tensor dv;                       // [batch, seqlen_k, heads_kv, head_dim_v]
  // false allows run-to-run differences in the last bits of dq on GPU backends (kCudaSm80 sums dQ
  // with fp32 atomics, and dk/dv of the key blocks it splits to fill the last wave: fastest); true
  // gives the same bits on every run (dQ in a kernel of its own, no atomics, no split; a little
  // slower, and less workspace). Either way the results are equally exact.
  // CPU backends are always deterministic and ignore it.
  bool deterministic = false;
};

// How to run; changes speed only, never results (every CPU backend's result is independent of the
// thread count and bit-for-bit repeatable; see kCudaSm80 and BackwardParams::deterministic for the
// GPU backward's dQ).
struct Launch {
  Backend backend = Backend::kAuto;
  int num_threads = 0;           // CPU: 0 = every hardware thread
  void* stream = nullptr;        // cudaStream_t for GPU backends
  void* workspace = nullptr;     // caller-owned scratch of at least *_workspace_size() bytes, any
  size_t workspace_bytes = 0;    // alignment; CPU backends allocate it themselves when it is null.
                                 // GPU backends need it whenever the size is not 0 (the backward;
                                 // the kCudaSm90 forward where it splits its last wave of work
                                 // over every SM: about 7-18 MB), device memory of the stream's
                                 // device, not used by another call in flight
};

// One selection point per operation: these three agree by construction.
Status forward_supported(const ForwardParams& params, const Launch& launch = {});
Status forward_workspace_size(const ForwardParams& params, const Launch& launch, size_t* bytes);
Status forward(const ForwardParams& params, const Launch& launch = {});

Status backward_supported(const BackwardParams& params, const Launch& launch = {});
Status backward_workspace_size(const BackwardParams& params, const Launch& launch, size_t* bytes);
Status backward(const BackwardParams& params, const Launch& launch = {});

// Names for messages and tools.
const char* to_string(DType dtype);
const char* to_string(Backend backend);
const char* to_string(StatusCode code);

}  // namespace flashattn
