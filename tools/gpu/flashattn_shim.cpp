// A C entry point over the public forward for ctypes (tools/gpu/bench_sdpa.py): contiguous
// [batch, seqlen, heads, head_dim] device tensors, as torch lays them out before the transpose
// that SDPA takes; `backend` is a flashattn::Backend value (4 cuda-sm80, 5 cuda-sm90). Returns 0
// on success, else the StatusCode (the message goes to `message`).
#include <cstdint>
#include <cstring>

#include "flashattn/flashattn.hpp"

namespace {

// The call's status as the C entry points return it: 0, or the StatusCode with the message copied
// into `message`.
int report(const flashattn::Status& st, char* message, int message_bytes) {
  if (!st.ok() && message_bytes > 0) {
    std::strncpy(message, st.message.c_str(), message_bytes - 1);
    message[message_bytes - 1] = '\0';
  }
  return static_cast<int>(st.code);
}

// Contiguous [batch, seqlen, heads, head_dim] q, k, v, o with head_dim_v = head_dim.
flashattn::ForwardParams forward_params(const void* q, const void* k, const void* v, void* o, int dtype, int64_t batch,
                                        int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, int64_t heads_kv,
                                        int64_t head_dim, int causal) {
  flashattn::ForwardParams p;
  p.dtype = static_cast<flashattn::DType>(dtype);
  p.batch = batch;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.head_dim = head_dim;
  p.head_dim_v = head_dim;
  p.q = flashattn::contiguous(q, seqlen_q, heads_q, head_dim);
  p.k = flashattn::contiguous(k, seqlen_k, heads_kv, head_dim);
  p.v = flashattn::contiguous(v, seqlen_k, heads_kv, head_dim);
  p.o = flashattn::contiguous(o, seqlen_q, heads_q, head_dim);
  p.causal = causal != 0;
  return p;
}

flashattn::BackwardParams backward_params(const void* q, const void* k, const void* v, const void* o, const void* d_o,
                                          const float* lse, void* dq, void* dk, void* dv, int dtype, int64_t batch,
                                          int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, int64_t heads_kv,
                                          int64_t head_dim, int causal, int top_left) {
  flashattn::BackwardParams p;
  p.dtype = static_cast<flashattn::DType>(dtype);
  p.batch = batch;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.head_dim = head_dim;
  p.q = flashattn::contiguous(q, seqlen_q, heads_q, head_dim);
  p.k = flashattn::contiguous(k, seqlen_k, heads_kv, head_dim);
  p.v = flashattn::contiguous(v, seqlen_k, heads_kv, head_dim);
  p.o = flashattn::contiguous(o, seqlen_q, heads_q, head_dim);
  p.d_o = flashattn::contiguous(d_o, seqlen_q, heads_q, head_dim);
  p.dq = flashattn::contiguous(dq, seqlen_q, heads_q, head_dim);
  p.dk = flashattn::contiguous(dk, seqlen_k, heads_kv, head_dim);
  p.dv = flashattn::contiguous(dv, seqlen_k, heads_kv, head_dim);
  p.lse = lse;
  p.lse_batch_stride = heads_q * seqlen_q;
  p.lse_head_stride = seqlen_q;
  p.causal = causal != 0;
  p.alignment = top_left ? flashattn::Alignment::kTopLeft : flashattn::Alignment::kBottomRight;
  return p;
}

}  // namespace

// The forward through the public API. With workspace == NULL it only writes the workspace size the
// call needs to *workspace_bytes (the sm90 split tail's; 0 when it needs none), and runs nothing.
extern "C" int flashattn_shim_forward(const void* q, const void* k, const void* v, void* o, float* lse, int dtype,
                                      int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                                      int64_t heads_kv, int64_t head_dim, int causal, int top_left, int backend,
                                      void* workspace, size_t* workspace_bytes, void* stream, char* message,
                                      int message_bytes) {
  flashattn::ForwardParams p =
      forward_params(q, k, v, o, dtype, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal);
  p.alignment = top_left ? flashattn::Alignment::kTopLeft : flashattn::Alignment::kBottomRight;
  p.maybe_lse = lse;
  p.lse_batch_stride = heads_q * seqlen_q;
  p.lse_head_stride = seqlen_q;
  flashattn::Launch launch;
  launch.backend = static_cast<flashattn::Backend>(backend);
  launch.stream = stream;
  if (workspace == nullptr) return report(flashattn::forward_workspace_size(p, launch, workspace_bytes), message, message_bytes);
  launch.workspace = workspace;
  launch.workspace_bytes = *workspace_bytes;
  return report(flashattn::forward(p, launch), message, message_bytes);
}

// The forward with score modifiers (for timing them): softcap (0: none), ALiBi slopes [heads_q]
// (null: none), an additive bias of q's dtype with element strides over (batch, head, row) (null:
// none; zero strides broadcast) and a boolean mask, one byte per element, likewise.
extern "C" int flashattn_shim_forward_mods(const void* q, const void* k, const void* v, void* o, int dtype,
                                           int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim,
                                           int causal, float softcap, const float* alibi_slopes, const void* bias,
                                           int64_t bias_batch_stride, int64_t bias_head_stride,
                                           int64_t bias_row_stride, const uint8_t* mask, int64_t mask_batch_stride,
                                           int64_t mask_head_stride, int64_t mask_row_stride, char* message,
                                           int message_bytes) {
  flashattn::ForwardParams p = forward_params(q, k, v, o, dtype, batch, seqlen, seqlen, heads, heads, head_dim, causal);
  p.softcap = softcap;
  p.maybe_alibi_slopes = alibi_slopes;
  p.maybe_bias = {bias, p.dtype, bias_batch_stride, bias_head_stride, bias_row_stride};
  p.maybe_mask = {mask, mask_batch_stride, mask_head_stride, mask_row_stride};
  flashattn::Launch launch;
  launch.backend = flashattn::Backend::kCudaSm80;
  return report(flashattn::forward(p, launch), message, message_bytes);
}

// The backward through the public API (backend cuda-sm80). With workspace == NULL it only writes the
// workspace size the call needs to *workspace_bytes. Returns 0 or the StatusCode (message in `message`).
extern "C" int flashattn_shim_backward(const void* q, const void* k, const void* v, const void* o, const void* d_o,
                                       const float* lse, void* dq, void* dk, void* dv, void* workspace,
                                       size_t* workspace_bytes, int dtype, int64_t batch, int64_t seqlen_q,
                                       int64_t seqlen_k, int64_t heads_q, int64_t heads_kv, int64_t head_dim,
                                       int causal, int top_left, void* stream, char* message, int message_bytes) {
  const flashattn::BackwardParams p = backward_params(q, k, v, o, d_o, lse, dq, dk, dv, dtype, batch, seqlen_q,
                                                      seqlen_k, heads_q, heads_kv, head_dim, causal, top_left);
  flashattn::Launch launch;
  launch.backend = flashattn::Backend::kCudaSm80;
  launch.stream = stream;
  flashattn::Status st;
  if (workspace == nullptr) {
    st = flashattn::backward_workspace_size(p, launch, workspace_bytes);
  } else {
    launch.workspace = workspace;
    launch.workspace_bytes = *workspace_bytes;
    st = flashattn::backward(p, launch);
  }
  return report(st, message, message_bytes);
}
