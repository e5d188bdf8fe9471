"""flashattn: exact attention computed the FlashAttention way, for NumPy, PyTorch and DLPack arrays.

    O = softmax(mask(softcap(scale * Q K^T) + alibi + bias)) V

Layout ``[batch, seqlen, heads, head_dim]`` (flash-attn's); k and v may have fewer heads than q
(GQA / MQA). The result has the input's array type: NumPy in, NumPy out; torch in, torch out (with
autograd, ``torch.compile`` and ``torch.library.opcheck`` support through ``flashattn.torch``,
imported on the first call with a tensor). ``flashattn.compat`` mirrors flash-attn's functions and
PyTorch's ``scaled_dot_product_attention``.

Options (forward and backward take the same):
  scale             None: 1/sqrt(head_dim)
  causal            hide keys after the diagonal
  causal_alignment  "bottom_right" (flash-attn: the last query sees the last key) or "top_left"
                    (PyTorch is_causal: query i sees keys 0..i); also where window and ALiBi measure from
  window            (left, right): keys more than left before / right after the diagonal are hidden; -1 unbounded
  softcap           > 0: s -> softcap * tanh(s / softcap), before ALiBi and bias
  alibi_slopes      float32 [heads] or [batch, heads]: score -= slope * |i + offset - j|
  bias              float array broadcastable to [batch, heads, seqlen_q, seqlen_k], added to the scores
  mask              bool array broadcastable to [batch, heads, seqlen_q, seqlen_k], True = attend
A query row that sees no key gets 0 output and -inf LSE.

Backward only (and torch autograd's backward, given to the forward):
  deterministic     False: on the GPU, dq (and dk/dv of blocks split to fill the last wave) may differ
                    in the last bits between runs (fp32 atomics, fastest);
                    True: bit-identical gradients on every run. The CPU is always deterministic.
"""

from __future__ import annotations

from . import _core, _ext

__version__ = "0.1.0"
__all__ = ["attention", "attention_backward", "attention_varlen", "attention_varlen_backward", "HAS_CUDA"]

HAS_CUDA = _ext.HAS_CUDA


_torch_module = None


def _torch():
    global _torch_module
    if _torch_module is None:
        from . import torch as flashattn_torch  # registers the torch.library operators on first use
        _torch_module = flashattn_torch
    return _torch_module


def attention(q, k, v, *, scale=None, causal=False, causal_alignment="bottom_right", window=(-1, -1), softcap=0.0,
              alibi_slopes=None, bias=None, mask=None, return_lse=False, backend="auto", deterministic=False):
    """Attention forward. Returns out [batch, seqlen_q, heads, head_dim_v], or (out, lse) with
    return_lse=True, lse float32 [batch, heads, seqlen_q] (natural log). ``backend`` ("auto", "cpu",
    "reference", "standard", "cuda-sm80", "cuda-sm90") picks the implementation; results agree within
    rounding (auto on device arrays: the Hopper forward where it takes the problem, else sm80).
    ``deterministic`` is for torch autograd's backward of this call (arrays without autograd: unused)."""
    if _core.is_torch(q):
        return _torch().attention(q, k, v, scale=scale, causal=causal, causal_alignment=causal_alignment,
                                  window=window, softcap=softcap, alibi_slopes=alibi_slopes, bias=bias, mask=mask,
                                  return_lse=return_lse, backend=backend, deterministic=deterministic)
    opts = _core.options(scale, causal, causal_alignment, window, softcap)
    fn = _core.forward
    if _core.is_jax(q):
        fn = _core._jax_wrap(fn)
    return fn(q, k, v, alibi_slopes=alibi_slopes, bias=bias, mask=mask, return_lse=return_lse, backend=backend,
              opts=opts)


def attention_backward(grad_out, q, k, v, out, lse, *, scale=None, causal=False, causal_alignment="bottom_right",
                       window=(-1, -1), softcap=0.0, alibi_slopes=None, bias=None, mask=None, backend="auto",
                       deterministic=False):
    """Gradients (dq, dk, dv) of attention(q, k, v, ...) given grad_out = dLoss/dout and the forward's
    out and lse (from return_lse=True). Bias, mask and ALiBi slopes get no gradient. deterministic=True:
    the same bits on every run, also on the GPU."""
    opts = _core.options(scale, causal, causal_alignment, window, softcap)
    if _core.is_torch(q):
        return _torch().attention_backward(grad_out, q, k, v, out, lse, alibi_slopes=alibi_slopes, bias=bias,
                                           mask=mask, backend=backend, deterministic=deterministic, opts=opts)
    fn = _core.backward
    if _core.is_jax(q):
        fn = _core._jax_wrap(fn)
    return fn(grad_out, q, k, v, out, lse, alibi_slopes=alibi_slopes, bias=bias, mask=mask, backend=backend,
              deterministic=deterministic, opts=opts)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, scale=None, causal=False,
                     causal_alignment="bottom_right", window=(-1, -1), softcap=0.0, alibi_slopes=None,
                     return_lse=False, backend="auto", deterministic=False):
    """Variable-length batch: q [total_q, heads, head_dim], k/v [total_k, heads_kv, ...]; sequence b owns
    rows cu_seqlens[b]:cu_seqlens[b+1] (int32 [batch + 1], on q's device). lse is [heads, total_q]."""
    if _core.is_torch(q):
        return _torch().attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale=scale,
                                         causal=causal, causal_alignment=causal_alignment, window=window,
                                         softcap=softcap, alibi_slopes=alibi_slopes, return_lse=return_lse,
                                         backend=backend, deterministic=deterministic)
    opts = _core.options(scale, causal, causal_alignment, window, softcap)
    return _core.forward(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                         max_seqlen_k=max_seqlen_k, alibi_slopes=alibi_slopes, return_lse=return_lse,
                         backend=backend, opts=opts)


def attention_varlen_backward(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                              scale=None, causal=False, causal_alignment="bottom_right", window=(-1, -1),
                              softcap=0.0, alibi_slopes=None, backend="auto", deterministic=False):
    """Gradients (dq, dk, dv) of attention_varlen; lse is the forward's [heads, total_q]."""
    opts = _core.options(scale, causal, causal_alignment, window, softcap)
    return _core.backward(grad_out, q, k, v, out, lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                          max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, alibi_slopes=alibi_slopes,
                          backend=backend, deterministic=deterministic, opts=opts)
