// The CUDA backends behind the one selection point (core/api.cpp). Each takes validated params
// whose pointers are device memory; supported() says, before anything runs, whether the backend
// takes a problem (naming what is missing when not), workspace() how many bytes of caller-owned
// device scratch it needs, and forward() enqueues the work on the given stream without allocating.
#pragma once

#include <cstddef>

#include "flashattn/flashattn.hpp"

namespace flashattn::detail {

// True when ptr is device (or managed) memory of the current device: how kAuto picks the GPU.
bool cuda_is_device_pointer(const void* ptr);

// FlashAttention-2 forward on mma.sync tensor cores, for compute capability 8.0 and later:
// fp16/bf16, head dims that are multiples of 8 up to the largest instantiation (256 in a full
// build), head_dim_v != head_dim up to a built pair (192, 128) or (64, 128), causal in both
// alignments, sliding window, softcap, ALiBi, additive bias, boolean mask (wholly masked key tiles
// skipped), GQA/MQA, varlen, LSE.
Status cuda_sm80_forward_supported(const ForwardParams& p);
size_t cuda_sm80_forward_workspace(const ForwardParams& p);
// stream: a cudaStream_t. Returns kInternal when a launch fails (the kernels' own end is the stream's).
Status cuda_sm80_forward(const ForwardParams& p, void* workspace, void* stream);

// The Hopper forward (compute capability 9.0, sm_90a code): FlashAttention-3's warp-specialised
// design on TMA, mbarrier pipelines and wgmma (cuda/sm90/). fp16/bf16, head_dim_v == head_dim,
// multiples of 8 up to the largest sm90 instantiation (64/96/128/192/256 built; others run on the
// next), causal in both alignments, sliding window, softcap, GQA/MQA, varlen, LSE; a persistent
// grid (one block per SM) where the head dim's policy asks for it, no workspace. Refuses (naming it) what it does not take: other devices,
// builds without sm_90a, ALiBi, bias, mask, strides that TMA cannot take (16-byte multiples).
// kAuto's forward asks it first on device data.
Status cuda_sm90_forward_supported(const ForwardParams& p);
size_t cuda_sm90_forward_workspace(const ForwardParams& p);
// stream: a cudaStream_t. Returns kInternal when a launch fails.
Status cuda_sm90_forward(const ForwardParams& p, void* workspace, void* stream);

// FlashAttention-2 backward on mma.sync (compute capability 8.0 and later, where the device has the
// shared memory: the plain kernel takes 161-209 KB per block, so devices with 99 KB, the RTX 30/40
// series, are refused by name): fp16/bf16, multiples of 8 up to the largest backward instantiation
// (256 in a full build; d = 256 needs sm_90-class shared memory), head_dim_v != head_dim up to a
// built pair (192, 128) or (64, 128), causal in both alignments, sliding window, softcap, ALiBi,
// bias, mask (a second kernel variant; no gradient for bias, mask and slopes), GQA/MQA, varlen; lse
// is required. The workspace holds per-row D = rowsum(dO ∘ O) and lse·log2e, and, unless
// p.deterministic, the fp32 dQ accumulator that the main kernel adds into with atomics (the last
// bits of dQ then depend on the order of the adds); deterministic mode computes dQ in a kernel of
// its own, no atomics.
Status cuda_sm80_backward_supported(const BackwardParams& p);
size_t cuda_sm80_backward_workspace(const BackwardParams& p);
// stream: a cudaStream_t. Returns kInternal when a launch fails.
Status cuda_sm80_backward(const BackwardParams& p, void* workspace, void* stream);

}  // namespace flashattn::detail
