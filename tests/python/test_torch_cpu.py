"""flashattn with PyTorch CPU tensors: autograd against the float64 reference and gradcheck,
torch.library.opcheck, torch.compile(fullgraph=True), flashattn.compat against PyTorch's SDPA, errors.
Skipped when torch is not installed."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attention_reference as ref  # noqa: E402
import flashattn  # noqa: E402
from flashattn import compat  # noqa: E402
import flashattn.torch  # noqa: E402,F401  (registers torch.ops.flashattn)

from test_numpy import GRAD_TOL, OPTIONS, TOL, assert_close, make_problem  # noqa: E402


def tensors(rng, shape, option, dtype=torch.float32, requires_grad=True):
    q, k, v, kw = make_problem(rng, shape, option)
    to = lambda x: torch.from_numpy(x).to(dtype).requires_grad_(requires_grad)  # noqa: E731
    kw_t = {key: torch.from_numpy(val) if isinstance(val, np.ndarray) else val for key, val in kw.items()}
    return (q, k, v, kw), (to(q), to(k), to(v), kw_t)


@pytest.mark.parametrize("option", ["plain", "causal_top_left", "window", "scale_softcap", "alibi_batch_heads",
                                    "mask_full_bias_head", "everything"])
def test_autograd_matches_reference(option):
    rng = ref.seed_rng()
    (q, k, v, kw), (qt, kt, vt, kwt) = tensors(rng, (2, 37, 29, 4, 2, 32, 32), OPTIONS[option])
    out, lse = flashattn.attention(qt, kt, vt, return_lse=True, **kwt)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and lse.shape == (2, 4, 37)
    assert not lse.requires_grad
    grad_out = rng.standard_normal(out.shape).astype(np.float32)
    out.backward(torch.from_numpy(grad_out))
    out_ref, lse_ref = ref.forward(q, k, v, **kw)
    assert_close(out.detach().numpy(), out_ref, TOL[np.float32], "out")
    assert_close(lse.numpy(), lse_ref, TOL[np.float32], "lse")
    for name, t, g_ref in zip(("dq", "dk", "dv"), (qt, kt, vt), ref.backward(grad_out, q, k, v, **kw)):
        assert_close(t.grad.numpy(), g_ref, GRAD_TOL[np.float32], name)


def test_bfloat16_tensors():
    rng = ref.seed_rng()
    (q, k, v, kw), (qt, kt, vt, _) = tensors(rng, (1, 30, 40, 2, 1, 64, 64), {}, dtype=torch.bfloat16)
    out = flashattn.attention(qt, kt, vt, causal=True)
    assert out.dtype == torch.bfloat16
    f = lambda t: t.detach().float().numpy()  # noqa: E731
    assert_close(f(out), ref.forward(f(qt), f(kt), f(vt), causal=True)[0], TOL["bfloat16"], "out")
    out.sum().backward()
    assert qt.grad.dtype == torch.bfloat16 and torch.isfinite(qt.grad.float()).all()


def test_gradcheck():
    # The C++ takes fp32/fp16/bf16 only, so gradcheck runs in fp32 with loose finite differences.
    rng = ref.seed_rng()
    _, (q, k, v, kw) = tensors(rng, (1, 5, 7, 2, 1, 8, 8), OPTIONS["everything"])
    fn = lambda q, k, v: flashattn.attention(q, k, v, **kw)  # noqa: E731
    with pytest.warns(UserWarning, match="double precision"):
        assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-2, atol=2e-2, rtol=2e-2)


def _opcheck_samples():
    rng = np.random.default_rng(1)
    t = lambda *s: torch.from_numpy(rng.standard_normal(s).astype(np.float32))  # noqa: E731
    q, k, v = t(2, 9, 4, 16).requires_grad_(), t(2, 13, 2, 16).requires_grad_(), t(2, 13, 2, 16).requires_grad_()
    bias, mask = t(1, 4, 9, 13), torch.from_numpy(rng.random((2, 1, 1, 13)) < 0.8)
    slopes = torch.rand(4)
    cu_q, cu_k = torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([0, 6, 13], dtype=torch.int32)
    return [  # the last argument, deterministic, left to its default in the first sample
        (q, k, v, None, None, None, None, None, 0, 0, 0.0, False, 0, -1, -1, 0.0, 0),
        (q, k, v, bias, mask, slopes, None, None, 0, 0, 0.25, True, 1, 5, -1, 3.0, 0, True),
        (q[0], k[0], v[0], None, None, None, cu_q, cu_k, 5, 7, 0.0, True, 0, -1, -1, 0.0, 0, False),
    ]


@pytest.mark.parametrize("sample", range(3), ids=["plain", "options", "varlen"])
def test_opcheck(sample):
    args = _opcheck_samples()[sample]
    torch.library.opcheck(torch.ops.flashattn.forward.default, args)
    q, k, v = (a.detach() for a in args[:3])
    out, lse = torch.ops.flashattn.forward(*args)
    torch.library.opcheck(torch.ops.flashattn.backward.default, (torch.randn_like(out), q, k, v, out.detach(), lse,
                                                                 *args[3:]))


class Block(torch.nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        o = flashattn.attention(q, k, v, causal=True, window=(8, -1))
        o2 = compat.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=True)
        return self.proj(o.reshape(b, s, d) + o2.transpose(1, 2).reshape(b, s, d))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(backend):
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(2, 19, 32)
    eager = model(x)
    eager.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    out = compiled(x)
    out.sum().backward()
    torch.testing.assert_close(out, eager, atol=1e-5, rtol=1e-5)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(p.grad, g, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["causal", "bool_mask", "float_mask", "gqa", "scale"])
def test_sdpa_matches_pytorch(case):
    torch.manual_seed(0)
    b, h, sq, sk, d = 2, 4, 23, 31, 32
    hkv = 2 if case == "gqa" else h
    q = torch.randn(b, h, sq, d, requires_grad=True)
    k = torch.randn(b, hkv, sk, d, requires_grad=True)
    v = torch.randn(b, hkv, sk, d, requires_grad=True)
    kw = {"causal": {"is_causal": True}, "gqa": {"enable_gqa": True, "is_causal": True}, "scale": {"scale": 0.4},
          "bool_mask": {"attn_mask": torch.rand(b, 1, sq, sk) < 0.7},
          "float_mask": {"attn_mask": torch.randn(sq, sk)}}[case]
    if case == "bool_mask":
        kw["attn_mask"][..., 0] = True
    outs, grads = [], []
    for fn in (compat.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention):
        out = fn(q, k, v, **kw)
        out.backward(torch.ones_like(out))
        outs.append(out)
        grads.append([t.grad.clone() for t in (q, k, v)])
        for t in (q, k, v):
            t.grad = None
    torch.testing.assert_close(outs[0], outs[1], atol=2e-5, rtol=2e-5)
    for g0, g1 in zip(*grads):
        torch.testing.assert_close(g0, g1, atol=1e-4, rtol=1e-4)


def test_flash_attn_compat_with_tensors():
    torch.manual_seed(0)
    qkv = torch.randn(2, 17, 3, 2, 16, requires_grad=True)
    out, lse, probs = compat.flash_attn_qkvpacked_func(qkv, causal=True, return_attn_probs=True)
    assert probs is None and lse.shape == (2, 2, 17)
    out.sum().backward()
    q, k, v = (qkv.detach()[:, :, i].numpy() for i in range(3))
    assert_close(out.detach().numpy(), ref.forward(q, k, v, causal=True)[0], TOL[np.float32], "out")
    grads = ref.backward(np.ones(out.shape, np.float32), q, k, v, causal=True)
    assert_close(qkv.grad.numpy(), np.stack(grads, axis=2), GRAD_TOL[np.float32], "dqkv")

    cu = torch.tensor([0, 7, 17], dtype=torch.int32)
    qv = torch.randn(17, 4, 16, requires_grad=True)
    kv = torch.randn(17, 2, 16, requires_grad=True)
    out = compat.flash_attn_varlen_func(qv, kv, kv, cu, cu, 10, 10, causal=True)
    out.sum().backward()
    for lo, hi in ((0, 7), (7, 17)):
        o_ref, _ = ref.forward(qv.detach()[None, lo:hi].numpy(), kv.detach()[None, lo:hi].numpy(),
                               kv.detach()[None, lo:hi].numpy(), causal=True)
        assert_close(out.detach()[lo:hi].numpy(), o_ref[0], TOL[np.float32], "varlen out")
    assert torch.isfinite(kv.grad).all() and kv.grad.abs().sum() > 0


@pytest.fixture
def backward_modes(monkeypatch):
    """The deterministic argument of every extension backward call made during the test."""
    seen = []
    real = flashattn._ext.backward

    def spy(*args, **kwargs):
        seen.append(kwargs["deterministic"])
        return real(*args, **kwargs)

    monkeypatch.setattr(flashattn._ext, "backward", spy)
    return seen


def test_deterministic_reaches_the_backward(backward_modes):
    """flash-attn's deterministic argument, flashattn.attention's and attention_backward's reach the C++
    backward through autograd and the custom ops (the CPU gives the same bits either way)."""
    torch.manual_seed(0)
    qkv = torch.randn(2, 19, 3, 4, 16)
    grads = []
    for deterministic in (False, True):
        leaf = qkv.clone().requires_grad_()
        compat.flash_attn_qkvpacked_func(leaf, causal=True, deterministic=deterministic).sum().backward()
        grads.append(leaf.grad)
    assert backward_modes == [False, True]
    assert torch.equal(grads[0], grads[1])

    q, k, v = (qkv[:, :, i].clone().requires_grad_() for i in range(3))
    compat.flash_attn_func(q, k, v, window_size=(5, 0), deterministic=True).sum().backward()
    flashattn.attention(q, k, v, deterministic=True).sum().backward()
    flashattn.attention(q, k, v).sum().backward()
    assert backward_modes[2:] == [True, True, False]

    cu = torch.tensor([0, 7, 19], dtype=torch.int32)
    qv, kv = torch.randn(19, 4, 16, requires_grad=True), torch.randn(19, 2, 16, requires_grad=True)
    compat.flash_attn_varlen_func(qv, kv, kv, cu, cu, 12, 12, causal=True, deterministic=True).sum().backward()
    assert backward_modes[5:] == [True]

    with torch.no_grad():
        out, lse = flashattn.attention(q, k, v, return_lse=True)
    flashattn.attention_backward(torch.ones_like(out), q.detach(), k.detach(), v.detach(), out, lse,
                                 deterministic=True)
    assert backward_modes[6:] == [True]


def test_deterministic_under_torch_compile(backward_modes):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 11, 2, 8, requires_grad=True) for _ in range(3))
    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, v: compat.flash_attn_func(q, k, v, causal=True, deterministic=True).sum(),
                       backend="aot_eager", fullgraph=True)
    fn(q, k, v).backward()
    assert backward_modes == [True]
    assert torch.isfinite(q.grad).all() and q.grad.abs().sum() > 0


def test_torch_errors_name_the_argument():
    q, k = torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8)
    with pytest.raises(TypeError, match="^k: "):
        flashattn.attention(q, k.half(), k)
    with pytest.raises(ValueError, match="^q: .*contiguous"):
        flashattn.attention(torch.randn(1, 4, 8, 2).transpose(2, 3), k, k)
    with pytest.raises(ValueError, match="^bias: .*detach"):
        flashattn.attention(q, k, k, bias=torch.zeros(4, 4, requires_grad=True))
    with pytest.raises(TypeError, match="^mask: "):
        flashattn.attention(q, k, k, mask=np.ones((4, 4), bool))
    with pytest.raises(ValueError, match="^v: "):
        flashattn.attention(q, k, k[:, :3])
