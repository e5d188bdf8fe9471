"""Framework-neutral plumbing: option checks, output allocation with the caller's framework, and the
calls into the C++ extension. PyTorch tensors take the path in ``flashattn.torch`` instead (custom
operators with autograd); everything here sees NumPy, CuPy and other DLPack arrays."""

from __future__ import annotations

import math

from . import _ext

_ALIGNMENTS = {"bottom_right": 0, "top_left": 1}
_BACKENDS = {name: i for i, name in enumerate(_ext.BACKENDS)}


def alignment_code(causal_alignment):
    try:
        return _ALIGNMENTS[causal_alignment]
    except (KeyError, TypeError):
        raise ValueError(
            f"causal_alignment: expected 'bottom_right' or 'top_left', got {causal_alignment!r}") from None


def backend_code(backend):
    try:
        return _BACKENDS[backend]
    except (KeyError, TypeError):
        raise ValueError(f"backend: expected one of {', '.join(_ext.BACKENDS)}, got {backend!r}") from None


def window_pair(window):
    try:
        left, right = window
        left, right = int(left), int(right)
    except (TypeError, ValueError):
        raise ValueError(f"window: expected a pair (left, right) of ints, -1 for unbounded, got {window!r}") from None
    if left < -1 or right < -1:
        raise ValueError(f"window: expected entries >= 0 or -1 (unbounded), got {window!r}")
    return left, right


def scale_value(scale):
    """None -> 0.0, which the C++ API reads as 1/sqrt(head_dim)."""
    if scale is None:
        return 0.0
    s = float(scale)
    if s == 0.0 or not math.isfinite(s):
        raise ValueError(f"scale: expected a finite nonzero number or None (1/sqrt(head_dim)), got {scale!r}")
    return s


def softcap_value(softcap):
    s = float(softcap)
    if not (math.isfinite(s) and s >= 0.0):
        raise ValueError(f"softcap: expected a finite number >= 0 (0 = off), got {softcap!r}")
    return s


def options(scale, causal, causal_alignment, window, softcap):
    """The keyword options as the extension takes them, checked once."""
    left, right = window_pair(window)
    return dict(scale=scale_value(scale), causal=bool(causal), alignment=alignment_code(causal_alignment),
                window_left=left, window_right=right, softcap=softcap_value(softcap))


def is_torch(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "requires_grad")


def _bfloat16():
    try:
        import ml_dtypes
    except ImportError:
        return None
    return ml_dtypes.bfloat16


class _Numpy:
    """NumPy arrays: outputs from np.empty; ml_dtypes.bfloat16 passes as its uint16 bits."""

    def __init__(self, np):
        self.np = np
        self.bf16 = _bfloat16()
        self.stream = 0
        self.bf16_as_u16 = False  # set once an ml_dtypes.bfloat16 array passes as its uint16 bits

    def as_input(self, x, name):
        np = self.np
        if x is None:
            return None
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name}: expected a NumPy array like q, got {type(x).__name__}")
        if x.dtype == np.uint16:  # the bits of a bfloat16 array and a real uint16 one must not mix
            raise TypeError(f"{name}: expected a float or bool array, got uint16")
        return self.ext_view(x)

    def empty(self, shape, like, float32=False):
        dtype = self.np.float32 if float32 else like.dtype
        return self.np.empty(shape, dtype=dtype)

    def empty_bytes(self, n):
        return self.np.empty((n,), dtype=self.np.uint8)

    def widen_last(self, x, n):
        """x with its broadcast last dimension materialised to n entries."""
        np = self.np
        return np.ascontiguousarray(np.broadcast_to(x, x.shape[:-1] + (n,)))

    def last_stride_zero(self, x):
        return x.ndim > 0 and x.shape[-1] > 1 and x.strides[-1] == 0

    def is_bf16(self, x):
        return self.bf16 is not None and x.dtype == self.bf16

    def ext_view(self, x):
        if not self.is_bf16(x):
            return x
        self.bf16_as_u16 = True
        return x.view(self.np.uint16)


class _Cupy:
    """CuPy arrays: outputs from cupy.empty on q's device; CuPy's current stream is honoured."""

    bf16_as_u16 = False

    def __init__(self, q):
        import cupy
        self.cp = cupy
        self.device = q.device
        self.stream = cupy.cuda.get_current_stream().ptr

    def as_input(self, x, name):
        if x is not None and not isinstance(x, self.cp.ndarray):
            raise TypeError(f"{name}: expected a CuPy array like q, got {type(x).__name__}")
        return x

    def empty(self, shape, like, float32=False):
        with self.device:
            return self.cp.empty(shape, dtype=self.cp.float32 if float32 else like.dtype)

    def empty_bytes(self, n):
        with self.device:
            return self.cp.empty((n,), dtype=self.cp.uint8)

    def widen_last(self, x, n):
        return self.cp.ascontiguousarray(self.cp.broadcast_to(x, x.shape[:-1] + (n,)))

    def last_stride_zero(self, x):
        return x.ndim > 0 and x.shape[-1] > 1 and x.strides[-1] == 0

    def is_bf16(self, x):
        return False

    def ext_view(self, x):
        return x


class _ArrayApi:
    """Other DLPack arrays with an array-API namespace: outputs from xp.empty on q's device."""

    def __init__(self, q):
        self.xp = q.__array_namespace__()
        self.device = getattr(q, "device", None)
        self.stream = 0

    def as_input(self, x, name):
        return x

    def empty(self, shape, like, float32=False):
        dtype = self.xp.float32 if float32 else like.dtype
        if self.device is None:
            return self.xp.empty(shape, dtype=dtype)
        return self.xp.empty(shape, dtype=dtype, device=self.device)

    def empty_bytes(self, n):
        return self.empty((n,), self.xp.empty((0,), dtype=self.xp.uint8))

    def widen_last(self, x, n):
        return self.xp.asarray(self.xp.broadcast_to(x, tuple(x.shape[:-1]) + (n,)), copy=True)

    def last_stride_zero(self, x):
        strides = getattr(x, "strides", None)
        return bool(strides) and x.shape[-1] > 1 and strides[-1] == 0

    def is_bf16(self, x):
        return False

    def ext_view(self, x):
        return x

    bf16_as_u16 = False


def _jax_to_numpy(x):
    import numpy as np
    if x is None:
        return None
    devices = x.devices() if hasattr(x, "devices") else set()
    if any(d.platform != "cpu" for d in devices):
        raise TypeError("q: JAX arrays on a GPU are not supported yet (JAX arrays are immutable, so the "
                        "output cannot be written in place); use CuPy or PyTorch, or move the arrays to the CPU")
    return np.asarray(x)


def namespace(q):
    mod = type(q).__module__
    if mod.startswith("numpy"):
        import numpy
        return _Numpy(numpy)
    if mod.startswith("cupy"):
        return _Cupy(q)
    if hasattr(q, "__array_namespace__") and hasattr(q, "__dlpack__"):
        return _ArrayApi(q)
    raise TypeError(f"q: expected a NumPy, PyTorch, CuPy or other DLPack array, got {type(q).__name__}")


def _call(fn, ns, *args, **kwargs):
    """Runs an extension call; a GPU backend that asks for workspace gets it from the framework."""
    need = fn(*args, workspace=None, **kwargs)
    if need > 0:
        ws = ns.empty_bytes(need)
        need = fn(*args, workspace=ws, **kwargs)
        assert need == 0, "the extension asked for workspace twice"


def prepare_score_input(ns, x, name, seqlen_k):
    """bias / mask: a broadcast last (seqlen_k) dimension is materialised, the rest stays broadcast."""
    if x is None:
        return None
    x = ns.as_input(x, name)
    if getattr(x, "ndim", 0) >= 1 and ((x.shape[-1] == 1 and seqlen_k != 1) or ns.last_stride_zero(x)):
        x = ns.widen_last(x, seqlen_k)
    return x


def _jax_wrap(fn):
    """JAX arrays on the CPU: computed on NumPy views, returned as JAX arrays."""

    def run(q, *arrays, **kwargs):
        import jax.numpy as jnp
        kwargs = {key: _jax_to_numpy(val) if is_jax(val) else val for key, val in kwargs.items()}
        result = fn(_jax_to_numpy(q), *[_jax_to_numpy(a) for a in arrays], **kwargs)
        if isinstance(result, tuple):
            return tuple(jnp.asarray(r) for r in result)
        return jnp.asarray(result)

    return run


def is_jax(x):
    return type(x).__module__.startswith("jax")


def forward(q, k, v, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, alibi_slopes=None,
            bias=None, mask=None, return_lse=False, backend="auto", opts):
    ns = namespace(q)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    q_, k_, v_ = (ns.as_input(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    for name, x in (("q", q), ("k", k), ("v", v)):
        if getattr(x, "ndim", None) != (3 if varlen else 4):
            raise ValueError(f"{name}: expected {'3' if varlen else '4'} dimensions "
                             f"{'[total, heads, head_dim]' if varlen else '[batch, seqlen, heads, head_dim]'}, "
                             f"got shape {tuple(getattr(x, 'shape', ()))}")
    seqlen_k = max_seqlen_k if varlen else k.shape[1]
    bias_ = prepare_score_input(ns, bias, "bias", seqlen_k)
    mask_ = prepare_score_input(ns, mask, "mask", seqlen_k)
    out = ns.empty(tuple(q.shape[:-1]) + (v.shape[-1],), q)
    if varlen:
        lse_shape = (q.shape[1], q.shape[0])
    else:
        lse_shape = (q.shape[0], q.shape[2], q.shape[1])
    lse = ns.empty(lse_shape, q, float32=True) if return_lse else None
    args = (q_, k_, v_, ns.ext_view(out), lse, bias_, mask_, ns.as_input(alibi_slopes, "alibi_slopes"),
            ns.as_input(cu_seqlens_q, "cu_seqlens_q"), ns.as_input(cu_seqlens_k, "cu_seqlens_k"), int(max_seqlen_q),
            int(max_seqlen_k), opts["scale"], opts["causal"], opts["alignment"], opts["window_left"],
            opts["window_right"], opts["softcap"], backend_code(backend), ns.stream)
    _call(_ext.forward, ns, *args, num_threads=0, bf16_as_u16=ns.bf16_as_u16)
    return (out, lse) if return_lse else out


def backward(grad_out, q, k, v, out, lse, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0,
             alibi_slopes=None, bias=None, mask=None, backend="auto", deterministic=False, opts):
    ns = namespace(q)
    varlen = cu_seqlens_q is not None
    if getattr(k, "ndim", 0) < 2:
        raise ValueError(f"k: expected 4 dimensions [batch, seqlen, heads, head_dim], got shape {getattr(k, 'shape', ())}")
    seqlen_k = max_seqlen_k if varlen else k.shape[1]
    bias_ = prepare_score_input(ns, bias, "bias", seqlen_k)
    mask_ = prepare_score_input(ns, mask, "mask", seqlen_k)
    ins = [ns.as_input(x, n) for x, n in ((grad_out, "grad_out"), (q, "q"), (k, "k"), (v, "v"), (out, "out"),
                                          (lse, "lse"))]
    grads = [ns.empty(tuple(x.shape), x) for x in (q, k, v)]
    args = (*ins, *[ns.ext_view(g) for g in grads], bias_, mask_, ns.as_input(alibi_slopes, "alibi_slopes"),
            ns.as_input(cu_seqlens_q, "cu_seqlens_q"), ns.as_input(cu_seqlens_k, "cu_seqlens_k"), int(max_seqlen_q),
            int(max_seqlen_k), opts["scale"], opts["causal"], opts["alignment"], opts["window_left"],
            opts["window_right"], opts["softcap"], backend_code(backend), ns.stream)
    _call(_ext.backward, ns, *args, num_threads=0, bf16_as_u16=ns.bf16_as_u16, deterministic=bool(deterministic))
    return tuple(grads)
