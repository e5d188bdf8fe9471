"""PyTorch integration: ``flashattn::forward`` and ``flashattn::backward`` as torch.library custom
operators, with fake (meta) implementations and autograd, so ``torch.compile(fullgraph=True)``,
``torch.library.opcheck`` and ``torch.autograd`` work. CPU tensors run the CPU backend, CUDA tensors
the GPU backend on the current CUDA stream. Imported by ``flashattn`` on the first call with a tensor.

Bias, mask and ALiBi slopes get no gradient (a bias that requires grad is refused); the LSE output
is not differentiable. The forward operator takes ``deterministic`` only to hand it to its autograd
backward (as flash-attn's does): True makes the GPU gradients bit-identical from run to run.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.utils.dlpack import to_dlpack

from . import _core, _ext

__all__ = ["attention", "attention_backward", "attention_varlen"]


def _stream(t: Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _run(fn, q: Tensor, *args, **options) -> None:
    """One extension call; a GPU backend that asks for workspace gets it from PyTorch's allocator.

    Tensors go as DLPack capsules from torch's C++ exporter, one per argument (the extension consumes
    each): about 10x cheaper than nanobind calling the Python-level Tensor.__dlpack__, which made up
    most of a tiny call's overhead."""
    stream = _stream(q)
    capsules = lambda: [to_dlpack(a) if isinstance(a, Tensor) else a for a in args]  # noqa: E731
    need = fn(*capsules(), stream=stream, workspace=None, num_threads=0, bf16_as_u16=False, **options)
    if need > 0:
        ws = torch.empty(need, dtype=torch.uint8, device=q.device)
        fn(*capsules(), stream=stream, workspace=ws, num_threads=0, bf16_as_u16=False, **options)


def _out_shapes(q: Tensor, v: Tensor, varlen: bool):
    out = (*q.shape[:-1], v.shape[-1])
    lse = (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])
    return out, lse


def _forward_impl(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], mask: Optional[Tensor],
             alibi_slopes: Optional[Tensor], cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
             max_seqlen_q: int, max_seqlen_k: int, scale: float, causal: bool, alignment: int, window_left: int,
             window_right: int, softcap: float, backend: int, deterministic: bool = False) -> Tuple[Tensor, Tensor]:
    out_shape, lse_shape = _out_shapes(q, v, cu_seqlens_q is not None)
    out = q.new_empty(out_shape)
    lse = q.new_empty(lse_shape, dtype=torch.float32)
    _run(_ext.forward, q, q, k, v, out, lse, bias, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
         max_seqlen_k, scale, causal, alignment, window_left, window_right, softcap, backend)
    return out, lse


_forward = torch.library.custom_op("flashattn::forward", _forward_impl, mutates_args=())


@_forward.register_fake
def _forward_fake(q, k, v, bias, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                  causal, alignment, window_left, window_right, softcap, backend, deterministic=False):
    out_shape, lse_shape = _out_shapes(q, v, cu_seqlens_q is not None)
    return q.new_empty(out_shape), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("flashattn::backward", mutates_args=())
def _backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, bias: Optional[Tensor],
              mask: Optional[Tensor], alibi_slopes: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
              cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, scale: float, causal: bool,
              alignment: int, window_left: int, window_right: int, softcap: float, backend: int,
              deterministic: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    _run(_ext.backward, q, grad_out, q, k, v, out, lse, dq, dk, dv, bias, mask, alibi_slopes, cu_seqlens_q,
         cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal, alignment, window_left, window_right, softcap,
         backend, deterministic=deterministic)
    return dq, dk, dv


@_backward.register_fake
def _backward_fake(grad_out, q, k, v, out, lse, bias, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                   max_seqlen_k, scale, causal, alignment, window_left, window_right, softcap, backend,
                   deterministic=False):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, bias, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k = inputs[:8]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, bias, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k)
    ctx.scalars = inputs[8:]  # max_seqlen_q ... backend, deterministic: _backward's trailing arguments
    ctx.mark_non_differentiable(lse)


def _autograd_backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, bias, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    if grad_out.stride(-1) != 1:  # e.g. the expanded gradient of a sum()
        grad_out = grad_out.contiguous()
    dq, dk, dv = _backward(grad_out, q, k, v, out, lse, bias, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                           *ctx.scalars)
    return (dq, dk, dv) + (None,) * 15


_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


# Per-call overhead: with no gradient to record and nothing tracing, plain tensors go straight to the
# implementation; the dispatcher and autograd bookkeeping of the custom operator cost more than a
# tiny attention. Subclasses (FakeTensor, DTensor, ...), meta tensors and torch.compile take the operator.
def _can_skip_dispatcher(q: Tensor, k: Tensor, v: Tensor) -> bool:
    if torch.compiler.is_compiling():
        return False
    if type(q) is not Tensor or type(k) is not Tensor or type(v) is not Tensor or q.device.type not in ("cpu", "cuda"):
        return False
    return not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))


def _score_input(x: Optional[Tensor], name: str, seqlen_k: int) -> Optional[Tensor]:
    """bias / mask: a broadcast last (seqlen_k) dimension is materialised; other broadcasts stay strides."""
    if x is None:
        return None
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor like q, got {type(x).__name__}")
    if x.dim() >= 1 and ((x.shape[-1] == 1 and seqlen_k != 1) or (x.shape[-1] > 1 and x.stride(-1) == 0)):
        x = x.expand(*x.shape[:-1], seqlen_k).contiguous()
    return x


def _check_tensors(**tensors) -> None:
    for name, t in tensors.items():
        if t is not None and not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor like q, got {type(t).__name__}")


def _no_grad_input(**tensors) -> None:
    for name, t in tensors.items():
        if t is not None and t.requires_grad:
            raise ValueError(f"{name}: flashattn computes no gradient for {name}; pass {name}.detach()")


# The per-call fast path (issue 5's overhead bar: a tiny forward within 1.2x of SDPA's call). For
# plain tensors with no gradient to record, no bias, mask or ALiBi and the automatic backend, the
# tensors go to the extension as ints (data_ptr, shape, strides, device index) instead of DLPack
# capsules, the checked options are cached, and the stream comes from the raw getter; the C++ checks
# shapes, dtypes and devices as on the full path. Anything else takes the full path below.
_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_options_cache: dict = {}


def _cached_options(scale, causal, causal_alignment, window, softcap):
    key = (scale, causal, causal_alignment, window, softcap)
    try:
        return _options_cache[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable option (a list window): check it every time
        return _core.options(scale, causal, causal_alignment, window, softcap)
    opts = _core.options(scale, causal, causal_alignment, window, softcap)
    if len(_options_cache) < 256:
        _options_cache[key] = opts
    return opts


def _fast_forward(q: Tensor, k: Tensor, v: Tensor, opts, return_lse: bool):
    device = q.get_device()  # -1 on the CPU
    if device >= 0:
        stream = _raw_stream(device) if _raw_stream is not None else torch.cuda.current_stream(device).cuda_stream
    else:
        stream = 0
    if v.shape[-1] == q.shape[-1]:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    else:
        out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32) if return_lse else None
    args = (_DTYPE_CODES[q.dtype], q.data_ptr(), q.shape, q.stride(), device, k.data_ptr(), k.shape, k.stride(),
            k.get_device(), v.data_ptr(), v.shape, v.stride(), v.get_device(), out.data_ptr(), out.stride(),
            lse.data_ptr() if return_lse else 0, opts["scale"], opts["causal"], opts["alignment"],
            opts["window_left"], opts["window_right"], opts["softcap"], stream)
    need = _ext.forward_raw(*args, 0, 0)
    if need > 0:
        ws = torch.empty(need, dtype=torch.uint8, device=q.device)
        _ext.forward_raw(*args, ws.data_ptr(), need)
    return (out, lse) if return_lse else out


def _fast_path_applies(q, k, v) -> bool:
    return (type(q) is Tensor and type(k) is Tensor and type(v) is Tensor and q.dtype in _DTYPE_CODES
            and q.dtype == k.dtype == v.dtype and q.dim() == 4 and k.dim() == 4 and v.dim() == 4
            and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
            and ((q.is_cuda and k.is_cuda and v.is_cuda) or (q.is_cpu and k.is_cpu and v.is_cpu))
            and not torch.compiler.is_compiling())


def attention(q: Tensor, k: Tensor, v: Tensor, *, scale=None, causal=False, causal_alignment="bottom_right",
              window=(-1, -1), softcap=0.0, alibi_slopes=None, bias=None, mask=None, return_lse=False,
              backend="auto", deterministic=False):
    """flashattn.attention for torch tensors (differentiable in q, k, v; deterministic: the mode of the
    backward autograd runs)."""
    opts = _cached_options(scale, causal, causal_alignment, window, softcap)
    if bias is None and mask is None and alibi_slopes is None and backend == "auto" and _fast_path_applies(q, k, v):
        return _fast_forward(q, k, v, opts, return_lse)
    _check_tensors(k=k, v=v, alibi_slopes=alibi_slopes)
    if k.dim() != 4:
        raise ValueError(f"k: expected 4 dimensions [batch, seqlen, heads, head_dim], got shape {tuple(k.shape)}")
    bias = _score_input(bias, "bias", k.shape[1])
    mask = _score_input(mask, "mask", k.shape[1])
    _no_grad_input(bias=bias, alibi_slopes=alibi_slopes)
    op = _forward_impl if _can_skip_dispatcher(q, k, v) else _forward
    out, lse = op(q, k, v, bias, mask, alibi_slopes, None, None, 0, 0, opts["scale"], opts["causal"],
                  opts["alignment"], opts["window_left"], opts["window_right"], opts["softcap"],
                  _core.backend_code(backend), bool(deterministic))
    return (out, lse) if return_lse else out


def attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                     max_seqlen_k: int, *, scale=None, causal=False, causal_alignment="bottom_right", window=(-1, -1),
                     softcap=0.0, alibi_slopes=None, return_lse=False, backend="auto", deterministic=False):
    """flashattn.attention_varlen for torch tensors (differentiable in q, k, v; deterministic as in
    attention)."""
    opts = _core.options(scale, causal, causal_alignment, window, softcap)
    _check_tensors(k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, alibi_slopes=alibi_slopes)
    _no_grad_input(alibi_slopes=alibi_slopes)
    out, lse = _forward(q, k, v, None, None, alibi_slopes, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                        int(max_seqlen_k), opts["scale"], opts["causal"], opts["alignment"], opts["window_left"],
                        opts["window_right"], opts["softcap"], _core.backend_code(backend), bool(deterministic))
    return (out, lse) if return_lse else out


def attention_backward(grad_out, q, k, v, out, lse, *, alibi_slopes=None, bias=None, mask=None, backend="auto",
                       deterministic=False, opts):
    """flashattn.attention_backward for torch tensors (not itself differentiable)."""
    _check_tensors(grad_out=grad_out, k=k, v=v, out=out, lse=lse, alibi_slopes=alibi_slopes)
    bias = _score_input(bias, "bias", k.shape[1] if k.dim() == 4 else 0)
    mask = _score_input(mask, "mask", k.shape[1] if k.dim() == 4 else 0)
    return _backward(grad_out, q, k, v, out, lse, bias, mask, alibi_slopes, None, None, 0, 0, opts["scale"],
                     opts["causal"], opts["alignment"], opts["window_left"], opts["window_right"], opts["softcap"],
                     _core.backend_code(backend), bool(deterministic))
