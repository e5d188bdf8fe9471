// The backends behind the one selection point (api.cpp). Each takes validated params; the
// workspace functions say how many bytes of scratch a call needs with `threads` workers, and the
// run functions get at least that much (never null when the size is non-zero).
#pragma once

#include <cstddef>

#include "flashattn/flashattn.hpp"

namespace flashattn::detail {

// Largest head_dim / head_dim_v each CPU-side backend takes.
inline constexpr int64_t kCpuMaxHeadDim = 512;

// Textbook three-step attention in double precision: the oracle of every test. Single-threaded,
// allocates its own [seqlen_q, seqlen_k] scratch.
void reference_forward(const ForwardParams& p);
void reference_backward(const BackwardParams& p);

// Standard attention in fp32 with S and P materialised per (batch, head): the speed and memory
// baseline. Workspace holds one [seqlen_q, seqlen_k] score matrix (and its packed operands) per worker.
size_t standard_forward_workspace(const ForwardParams& p, int threads);
void standard_forward(const ForwardParams& p, void* workspace, int threads);
size_t standard_backward_workspace(const BackwardParams& p, int threads);
void standard_backward(const BackwardParams& p, void* workspace, int threads);

// FlashAttention on the CPU: tiled, online softmax, vectorised with run-time ISA dispatch.
size_t cpu_forward_workspace(const ForwardParams& p, int threads);
void cpu_forward(const ForwardParams& p, void* workspace, int threads);
size_t cpu_backward_workspace(const BackwardParams& p, int threads);
void cpu_backward(const BackwardParams& p, void* workspace, int threads);

}  // namespace flashattn::detail
