/* Attention through the C ABI, from plain C99: what an FFI caller writes. */
#include <flashattn/flashattn.h>

#include <stdio.h>
#include <stdlib.h>

#include "c_api_attention.h"

int c_api_attention(const float* q, const float* k, const float* v, float* o, float* lse, int64_t batch,
                    int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, int64_t heads_kv, int64_t head_dim,
                    int causal) {
  fa_forward_params p;
  fa_forward_params_init(&p); /* struct_size and defaults first, then only what differs */
  p.dtype = FA_DTYPE_FLOAT32;
  p.batch = batch;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.head_dim = head_dim;
  p.causal = causal;
  p.alignment = FA_ALIGN_BOTTOM_RIGHT;

  /* Contiguous [batch, seqlen, heads, head_dim]: strides in elements. */
  p.q.data = q;
  p.q.batch_stride = seqlen_q * heads_q * head_dim;
  p.q.row_stride = heads_q * head_dim;
  p.q.head_stride = head_dim;
  p.k.data = k;
  p.k.batch_stride = seqlen_k * heads_kv * head_dim;
  p.k.row_stride = heads_kv * head_dim;
  p.k.head_stride = head_dim;
  p.v.data = v;
  p.v.batch_stride = p.k.batch_stride;
  p.v.row_stride = p.k.row_stride;
  p.v.head_stride = p.k.head_stride;
  p.o.data = o;
  p.o.batch_stride = p.q.batch_stride;
  p.o.row_stride = p.q.row_stride;
  p.o.head_stride = p.q.head_stride;
  p.maybe_lse = lse; /* [batch, heads_q, seqlen_q] */
  p.lse_batch_stride = heads_q * seqlen_q;
  p.lse_head_stride = seqlen_q;

  fa_launch launch;
  fa_launch_init(&launch);
  launch.backend = FA_BACKEND_CPU;

  /* Caller-owned workspace: ask for its size, then pass it in. */
  char err[256];
  size_t bytes = 0;
  fa_status s = fa_forward_workspace_size(&p, &launch, &bytes, err, sizeof err);
  if (s != FA_STATUS_OK) {
    fprintf(stderr, "fa_forward_workspace_size: %s: %s\n", fa_status_string(s), err);
    return 1;
  }
  void* workspace = bytes > 0 ? malloc(bytes) : NULL;
  if (bytes > 0 && workspace == NULL) {
    fprintf(stderr, "out of memory for %zu bytes of workspace\n", bytes);
    return 1;
  }
  launch.workspace = workspace;
  launch.workspace_bytes = bytes;
  s = fa_forward(&p, &launch, err, sizeof err);
  free(workspace);
  if (s != FA_STATUS_OK) {
    fprintf(stderr, "fa_forward: %s: %s\n", fa_status_string(s), err);
    return 1;
  }
  return 0;
}
