// A C entry point over the public forward (backend cuda-sm80) for ctypes (tools/gpu/bench_sdpa.py): contiguous
// [batch, seqlen, heads, head_dim] device tensors, as torch lays them out before the transpose
// that SDPA takes. Returns 0 on success, else the StatusCode (the message goes to `message`).
#include <cstdint>
#include <cstring>

#include "flashattn/flashattn.hpp"

extern "C" int flashattn_shim_forward(const void* q, const void* k, const void* v, void* o, float* lse, int dtype,
                                      int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                                      int64_t heads_kv, int64_t head_dim, int causal, int top_left, void* stream,
                                      char* message, int message_bytes) {
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
  p.alignment = top_left ? flashattn::Alignment::kTopLeft : flashattn::Alignment::kBottomRight;
  p.maybe_lse = lse;
  p.lse_batch_stride = heads_q * seqlen_q;
  p.lse_head_stride = seqlen_q;
  flashattn::Launch launch;
  launch.backend = flashattn::Backend::kCudaSm80;
  launch.stream = stream;
  const flashattn::Status st = flashattn::forward(p, launch);
  if (!st.ok()) {
    if (message_bytes > 0) {
      std::strncpy(message, st.message.c_str(), message_bytes - 1);
      message[message_bytes - 1] = '\0';
    }
    return static_cast<int>(st.code);
  }
  return 0;
}
