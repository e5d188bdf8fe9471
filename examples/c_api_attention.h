/* The example's C half: attention of contiguous fp32 tensors through the C ABI. Returns 0 on success. */
#ifndef FLASHATTN_EXAMPLE_C_API_ATTENTION_H_
#define FLASHATTN_EXAMPLE_C_API_ATTENTION_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int c_api_attention(const float* q, const float* k, const float* v, float* o, float* lse, int64_t batch,
                    int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, int64_t heads_kv, int64_t head_dim,
                    int causal);

#ifdef __cplusplus
}
#endif

#endif
