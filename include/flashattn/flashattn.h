/* flashattn C ABI: the C++ API of flashattn.hpp for C and FFI callers (ctypes, cffi, Rust, Go, ...).
 *
 * The structs mirror flashattn::ForwardParams, BackwardParams and Launch field for field, with the
 * same meaning, layouts and defaults (read flashattn.hpp for the semantics). Enums travel as int32_t
 * values named FA_*; booleans as int32_t (nonzero = true).
 *
 * Use:
 *   fa_forward_params p;  fa_forward_params_init(&p);   (sets struct_size and every default)
 *   p.dtype = FA_DTYPE_FLOAT32;  p.batch = ...;  p.q = ...;  p.o = ...;
 *   char err[256];
 *   if (fa_forward(&p, NULL, err, sizeof err) != FA_STATUS_OK) fprintf(stderr, "%s\n", err);
 *
 * ABI growth: every struct starts with struct_size, which the *_init functions set to the size
 * this header was compiled with. New fields are only ever appended; the library reads the fields
 * a caller's struct_size covers and gives later ones their defaults, and rejects a struct_size it
 * does not know (FA_STATUS_INVALID_ARGUMENT, message naming struct_size). Always call the init
 * function before filling a struct.
 *
 * Errors: every function returns an fa_status. When err is not NULL and err_len > 0, the message
 * (naming the argument at fault; empty on success) is written there, truncated to err_len - 1
 * bytes and always NUL-terminated. The library keeps no global or thread-local error state, and
 * no C++ exception crosses this boundary (an unexpected one becomes FA_STATUS_INTERNAL). On
 * error nothing else is written.
 */
#ifndef FLASHATTN_FLASHATTN_H_
#define FLASHATTN_FLASHATTN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version of this C ABI; bumped when fields are appended.
 *   2: fa_backward_params.deterministic */
#define FA_C_API_VERSION 2

typedef int32_t fa_status;
enum {
  FA_STATUS_OK = 0,
  FA_STATUS_INVALID_ARGUMENT = 1, /* a pointer, size, stride or option is wrong */
  FA_STATUS_NOT_SUPPORTED = 2,    /* valid, but the selected backend does not take it */
  FA_STATUS_WORKSPACE_TOO_SMALL = 3,
  FA_STATUS_INTERNAL = 4
};

/* Storage type of q, k, v, o (and d_o, dq, dk, dv); arithmetic is fp32 or wider. */
enum { FA_DTYPE_FLOAT32 = 0, FA_DTYPE_FLOAT16 = 1, FA_DTYPE_BFLOAT16 = 2 };

/* Which diagonal causal masking, the window and ALiBi measure from (pictures in flashattn.hpp). */
enum { FA_ALIGN_BOTTOM_RIGHT = 0, FA_ALIGN_TOP_LEFT = 1 };

/* FA_BACKEND_AUTO picks the fastest backend that supports the problem (the GPU when q is device
 * memory in a CUDA build). FA_BACKEND_CUDA_SM80: tensor-core kernels for compute capability >= 8.0.
 * FA_BACKEND_CUDA_SM90: the Hopper forward (compute capability 9.0; no backward), which AUTO picks
 * on sm_90 for the problems it takes. */
enum {
  FA_BACKEND_AUTO = 0,
  FA_BACKEND_CPU = 1,
  FA_BACKEND_REFERENCE = 2,
  FA_BACKEND_STANDARD = 3,
  FA_BACKEND_CUDA_SM80 = 4,
  FA_BACKEND_CUDA_SM90 = 5
};

/* A strided [batch, seqlen, heads, dim] view; strides in elements; dim is contiguous. */
typedef struct fa_const_tensor {
  const void* data;
  int64_t batch_stride;
  int64_t row_stride;
  int64_t head_stride;
} fa_const_tensor;

typedef struct fa_tensor {
  void* data;
  int64_t batch_stride;
  int64_t row_stride;
  int64_t head_stride;
} fa_tensor;

/* Additive bias [batch, heads_q, seqlen_q, seqlen_k]; zero strides broadcast. data NULL: none. */
typedef struct fa_bias {
  const void* data;
  int32_t dtype; /* FA_DTYPE_* */
  int32_t reserved0; /* padding, ignored */
  int64_t batch_stride;
  int64_t head_stride;
  int64_t row_stride; /* stride over seqlen_q; seqlen_k is contiguous */
} fa_bias;

/* Boolean mask [batch, heads_q, seqlen_q, seqlen_k], one byte each, nonzero = attend. data NULL: none. */
typedef struct fa_mask {
  const uint8_t* data;
  int64_t batch_stride;
  int64_t head_stride;
  int64_t row_stride;
} fa_mask;

/* flashattn::ForwardParams. */
typedef struct fa_forward_params {
  size_t struct_size; /* set by fa_forward_params_init */

  int32_t dtype; /* FA_DTYPE_*, default FLOAT32 */
  int32_t reserved0; /* padding, ignored */
  int64_t batch;
  int64_t seqlen_q; /* with varlen: the maximum length over the batch */
  int64_t seqlen_k;
  int64_t heads_q;
  int64_t heads_kv;   /* heads_q % heads_kv == 0 */
  int64_t head_dim;   /* of q and k */
  int64_t head_dim_v; /* of v and o; 0 = head_dim */

  fa_const_tensor q; /* [batch, seqlen_q, heads_q,  head_dim]   */
  fa_const_tensor k; /* [batch, seqlen_k, heads_kv, head_dim]   */
  fa_const_tensor v; /* [batch, seqlen_k, heads_kv, head_dim_v] */

  const int32_t* maybe_cu_seqlens_q; /* int32 [batch + 1]; both or neither */
  const int32_t* maybe_cu_seqlens_k;

  float softmax_scale; /* 0 = 1/sqrt(head_dim) */
  int32_t causal;      /* nonzero: same as window_right = 0 */
  int32_t alignment;   /* FA_ALIGN_*, default BOTTOM_RIGHT */
  float softcap;       /* > 0: s -> softcap * tanh(s / softcap); 0 = off */
  int64_t window_left; /* -1 = unbounded */
  int64_t window_right;

  const float* maybe_alibi_slopes; /* [heads_q] or [batch, heads_q]; NULL = none */
  int64_t alibi_batch_stride;      /* 0 for [heads_q] slopes */

  fa_bias maybe_bias;
  fa_mask maybe_mask;

  fa_tensor o;        /* [batch, seqlen_q, heads_q, head_dim_v] */
  float* maybe_lse;   /* fp32 [batch, heads_q, seqlen_q] (varlen: [heads_q, total_q]); NULL = not wanted */
  int64_t lse_batch_stride;
  int64_t lse_head_stride;
} fa_forward_params;

/* flashattn::BackwardParams. */
typedef struct fa_backward_params {
  size_t struct_size; /* set by fa_backward_params_init */

  int32_t dtype;
  int32_t reserved0;
  int64_t batch;
  int64_t seqlen_q;
  int64_t seqlen_k;
  int64_t heads_q;
  int64_t heads_kv;
  int64_t head_dim;
  int64_t head_dim_v;

  fa_const_tensor q;
  fa_const_tensor k;
  fa_const_tensor v;

  const int32_t* maybe_cu_seqlens_q;
  const int32_t* maybe_cu_seqlens_k;

  float softmax_scale;
  int32_t causal;
  int32_t alignment;
  float softcap;
  int64_t window_left;
  int64_t window_right;

  const float* maybe_alibi_slopes;
  int64_t alibi_batch_stride;

  fa_bias maybe_bias;
  fa_mask maybe_mask;

  fa_const_tensor o;   /* forward output [batch, seqlen_q, heads_q, head_dim_v] */
  fa_const_tensor d_o; /* dLoss/dO       [batch, seqlen_q, heads_q, head_dim_v] */
  const float* lse;    /* forward LSE, layout of fa_forward_params.maybe_lse */
  int64_t lse_batch_stride;
  int64_t lse_head_stride;
  fa_tensor dq; /* [batch, seqlen_q, heads_q,  head_dim]   */
  fa_tensor dk; /* [batch, seqlen_k, heads_kv, head_dim]   */
  fa_tensor dv; /* [batch, seqlen_k, heads_kv, head_dim_v] */

  /* Version 2. */
  int32_t deterministic; /* nonzero: gradients bit-identical across runs on GPU backends (default
                            0: the last bits of dq, and of dk/dv where a split last wave adds
                            them, may vary); CPU backends are always deterministic */
  int32_t reserved1;     /* padding, ignored */
} fa_backward_params;

/* flashattn::Launch: how to run; changes speed only, never results. A NULL fa_launch* means all defaults. */
typedef struct fa_launch {
  size_t struct_size; /* set by fa_launch_init */
  int32_t backend;     /* FA_BACKEND_*, default AUTO */
  int32_t num_threads; /* CPU: 0 = every hardware thread */
  void* stream;        /* cudaStream_t for GPU backends */
  void* workspace;     /* caller-owned scratch of at least *_workspace_size() bytes; NULL: allocated per call (CPU);
                          GPU backends need it whenever that size is not 0 (device memory of the stream's
                          device, not used by another call in flight) */
  size_t workspace_bytes;
} fa_launch;

/* Zero every field, then set struct_size and the defaults of the C++ member initialisers. NULL is ignored. */
void fa_forward_params_init(fa_forward_params* params);
void fa_backward_params_init(fa_backward_params* params);
void fa_launch_init(fa_launch* launch);

/* The one selection point per operation, as in C++: these three agree. launch may be NULL. */
fa_status fa_forward_supported(const fa_forward_params* params, const fa_launch* launch, char* err, size_t err_len);
fa_status fa_forward_workspace_size(const fa_forward_params* params, const fa_launch* launch, size_t* bytes,
                                    char* err, size_t err_len);
fa_status fa_forward(const fa_forward_params* params, const fa_launch* launch, char* err, size_t err_len);

fa_status fa_backward_supported(const fa_backward_params* params, const fa_launch* launch, char* err, size_t err_len);
fa_status fa_backward_workspace_size(const fa_backward_params* params, const fa_launch* launch, size_t* bytes,
                                     char* err, size_t err_len);
fa_status fa_backward(const fa_backward_params* params, const fa_launch* launch, char* err, size_t err_len);

/* Static names ("ok", "invalid argument", ...; "fp32", ...; "cpu", ...); "unknown" for other values. */
const char* fa_status_string(fa_status status);
const char* fa_dtype_string(int32_t dtype);
const char* fa_backend_string(int32_t backend);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHATTN_FLASHATTN_H_ */
