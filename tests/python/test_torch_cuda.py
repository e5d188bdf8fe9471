"""flashattn with PyTorch CUDA tensors (sm80 forward and backward): the forward against PyTorch's math
SDPA in float64 under the 2x rule, autograd gradients against a float64 reference under the 3x rule,
the caller's stream, torch.compile, opcheck, CUDA graph capture of a forward and of a backward, errors.
Skipped without torch, without a CUDA device, or when flashattn was built without CUDA."""

import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
import flashattn.torch  # noqa: E402,F401
from flashattn import compat  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif(not flashattn.HAS_CUDA, reason="flashattn built without CUDA"),
]

DTYPES = [torch.float16, torch.bfloat16]


def expand_and_mask(q, k, v, causal, alignment, window):
    """K and V with their heads repeated for GQA, and the [sq, sk] visibility of causal/window."""
    sq, h = q.shape[1], q.shape[2]
    sk = k.shape[1]
    group = h // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    offset = sk - sq if alignment == "bottom_right" else 0
    i = torch.arange(sq, device=q.device)[:, None] + offset
    j = torch.arange(sk, device=q.device)[None, :]
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    vis = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if left >= 0:
        vis &= j >= i - left
    if right >= 0:
        vis &= j <= i + right
    return k, v, vis


def math_sdpa(q, k, v, *, causal=False, alignment="bottom_right", window=(-1, -1), scale=None):
    """PyTorch's math SDPA on [batch, seq, heads, d] inputs, GQA expanded, with an explicit bool mask
    for the alignment and window."""
    k, v, vis = expand_and_mask(q, k, v, causal, alignment, window)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                               attn_mask=vis, scale=scale)
    out = out.transpose(1, 2)
    return torch.where(vis.any(-1)[None, :, None, None], out, torch.zeros_like(out))


def assert_2x_rule(out, q, k, v, **kw):
    """|flashattn - fp64| <= 2 |math SDPA in q's dtype - fp64| + 1e-5 (the C++ GPU tests' rule)."""
    d64 = [t.double() for t in (q, k, v)]
    exact = math_sdpa(*d64, **kw)
    baseline = math_sdpa(q, k, v, **kw).double()
    err = (out.double() - exact).abs().max().item()
    base = (baseline - exact).abs().max().item()
    assert err <= 2 * base + 1e-5, f"flashattn error {err} vs PyTorch math {base}"


SHAPES = [(2, 37, 50, 4, 2, 64), (1, 129, 77, 8, 1, 128), (3, 1, 300, 2, 2, 96), (1, 255, 255, 4, 4, 256)]
OPTIONS = [{}, {"causal": True}, {"causal": True, "causal_alignment": "top_left"}, {"window": (31, 7)},
           {"scale": 0.2}]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: "-".join(o) or "plain")
def test_forward_matches_math_sdpa(dtype, shape, option):
    torch.manual_seed(0)
    b, sq, sk, h, hkv, d = shape
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype)
    v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype)
    out, lse = flashattn.attention(q, k, v, return_lse=True, **option)
    assert out.is_cuda and out.dtype == dtype and lse.shape == (b, h, sq) and lse.dtype == torch.float32
    kw = {"causal": option.get("causal", False), "alignment": option.get("causal_alignment", "bottom_right"),
          "window": option.get("window", (-1, -1)), "scale": option.get("scale")}
    assert_2x_rule(out, q, k, v, **kw)


def attention_ref(q, k, v, *, causal=False, alignment="bottom_right", window=(-1, -1), scale=None):
    """Standard attention on [batch, seq, heads, d] in q's dtype (softmax in fp32, as eager attention),
    differentiable everywhere: a row that sees no key gets 0 output and 0 gradient (SDPA's NaN there
    would poison the reference gradients)."""
    d = q.shape[3]
    k, v, vis = expand_and_mask(q, k, v, causal, alignment, window)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * (d ** -0.5 if scale is None else scale)
    p = torch.softmax(s.float().masked_fill(~vis, -1e30), dim=-1).masked_fill(~vis, 0.0).to(q.dtype)
    return torch.einsum("bhqk,bkhd->bqhd", p, v)


# The GPU backward covers head_dim <= 128.
GRAD_SHAPES = [(2, 37, 50, 4, 2, 64), (1, 129, 77, 8, 1, 128), (3, 1, 300, 2, 2, 96), (2, 200, 200, 4, 4, 128)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", GRAD_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: "-".join(o) or "plain")
def test_gradients_match_reference(dtype, shape, option):
    """Autograd through flashattn against the fp64 reference: |ours - fp64| <= 3 |standard attention in
    q's dtype - fp64| + 1e-4 per gradient (the C++ GPU backward tests' rule)."""
    torch.manual_seed(0)
    b, sq, sk, h, hkv, d = shape
    inputs = [torch.randn(b, n, heads, d, device="cuda", dtype=dtype)
              for n, heads in ((sq, h), (sk, hkv), (sk, hkv))]
    grad_out = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
    kw = {"causal": option.get("causal", False), "alignment": option.get("causal_alignment", "bottom_right"),
          "window": option.get("window", (-1, -1)), "scale": option.get("scale")}

    def grads(fn, tensors):
        leaves = [t.detach().requires_grad_() for t in tensors]
        fn(*leaves).backward(grad_out.to(leaves[0].dtype))
        return [t.grad for t in leaves]

    ours = grads(lambda q, k, v: flashattn.attention(q, k, v, **option), inputs)
    exact = grads(lambda q, k, v: attention_ref(q, k, v, **kw), [t.double() for t in inputs])
    base = grads(lambda q, k, v: attention_ref(q, k, v, **kw), inputs)
    for name, g, g_exact, g_base in zip(("dq", "dk", "dv"), ours, exact, base):
        assert g.dtype == dtype and g.shape == g_exact.shape
        err = (g.double() - g_exact).abs().max().item()
        ref_err = (g_base.double() - g_exact).abs().max().item()
        assert err <= 3 * ref_err + 1e-4, f"{name}: flashattn error {err} vs standard attention {ref_err}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_deterministic_gradients_are_bit_identical(dtype):
    """flash-attn's deterministic=True: two autograd runs give the same bytes of dq, dk and dv (many key
    blocks add into each dq row here: GQA, long keys), within the 3x rule of the fp64 reference; dk and
    dv are also the default mode's bytes (one kernel computes them in both modes)."""
    torch.manual_seed(0)
    b, sq, sk, h, hkv, d = 2, 300, 517, 6, 2, 128
    inputs = [torch.randn(b, n, heads, d, device="cuda", dtype=dtype) for n, heads in ((sq, h), (sk, hkv), (sk, hkv))]
    grad_out = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)

    def grads(fn, tensors):
        leaves = [t.detach().requires_grad_() for t in tensors]
        fn(*leaves).backward(grad_out.to(leaves[0].dtype))
        return [t.grad for t in leaves]

    run = lambda deterministic: grads(  # noqa: E731
        lambda q, k, v: compat.flash_attn_func(q, k, v, causal=True, deterministic=deterministic), inputs)
    first, second, default = run(True), run(True), run(False)
    bits = lambda t: t.view(torch.int16)  # noqa: E731
    for name, g1, g2 in zip(("dq", "dk", "dv"), first, second):
        assert torch.equal(bits(g1), bits(g2)), f"{name} differs between two deterministic runs"
    for name, g1, g0 in zip(("dk", "dv"), first[1:], default[1:]):
        assert torch.equal(bits(g1), bits(g0)), f"{name} differs between the two modes"
    exact = grads(lambda q, k, v: attention_ref(q, k, v, causal=True), [t.double() for t in inputs])
    base = grads(lambda q, k, v: attention_ref(q, k, v, causal=True), inputs)
    for name, g, g0, g_exact, g_base in zip(("dq", "dk", "dv"), first, default, exact, base):
        ref_err = (g_base.double() - g_exact).abs().max().item()
        for mode, ours in (("deterministic", g), ("default", g0)):
            err = (ours.double() - g_exact).abs().max().item()
            assert err <= 3 * ref_err + 1e-4, f"{name} ({mode}): flashattn error {err} vs standard attention {ref_err}"


def test_deterministic_varlen_is_bit_identical():
    torch.manual_seed(0)
    lens = [0, 130, 301, 7]
    offsets = [0]
    for n in lens:
        offsets.append(offsets[-1] + n)
    cu = torch.tensor(offsets, dtype=torch.int32, device="cuda")
    total = offsets[-1]
    q = torch.randn(total, 4, 64, device="cuda", dtype=torch.float16)
    kv = torch.randn(total, 1, 64, device="cuda", dtype=torch.float16)

    def run():
        leaves = [t.detach().requires_grad_() for t in (q, kv, kv)]
        out = compat.flash_attn_varlen_func(*leaves, cu, cu, max(lens), max(lens), causal=True, deterministic=True)
        out.float().square().sum().backward()
        return [t.grad for t in leaves]

    for g1, g2 in zip(run(), run()):
        assert torch.isfinite(g1).all() and g1.abs().sum() > 0
        assert torch.equal(g1.view(torch.int16), g2.view(torch.int16))


def test_current_stream_is_used():
    torch.manual_seed(0)
    q = torch.randn(2, 500, 8, 128, device="cuda", dtype=torch.float16)
    expected = flashattn.attention(q, q, q, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = flashattn.attention(q, q, q, causal=True)
        copy = out.clone()  # ordered after the kernel only if it ran on `side`
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(copy, expected, atol=0, rtol=0)


def test_cuda_graph_capture_and_replay():
    torch.manual_seed(0)
    q = torch.randn(1, 64, 4, 64, device="cuda", dtype=torch.float16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    flashattn.attention(q, k, v)  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flashattn.attention(q, k, v, causal=True)
    for _ in range(2):
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, flashattn.attention(q, k, v, causal=True), atol=0, rtol=0)


def test_forward_with_workspace_under_graph_capture():
    """A shape whose work items fill a wave and a little (144 items of 16 key tiles): on an H100/H200
    the sm90 forward splits the last two waves' key tiles over every SM and needs workspace, which the
    call takes from PyTorch's allocator (inside the capture: the graph's pool). Exact under the 2x
    rule, and replayed bit for bit."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2000, 9, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = flashattn.attention(q, k, v)
    assert_2x_rule(out, q, k, v)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = flashattn.attention(q, k, v)
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(captured, out, atol=0, rtol=0)


def test_cuda_graph_capture_and_replay_backward():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 77, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad_out = torch.randn(2, 77, 4, 64, device="cuda", dtype=torch.bfloat16)

    def step():
        out = flashattn.attention(q, k, v, causal=True)
        return torch.autograd.grad(out, (q, k, v), grad_out)

    side = torch.cuda.Stream()  # warm-up on a side stream, as PyTorch's capture recipe asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for _ in range(2):
        with torch.no_grad():
            for t in (q, k, v, grad_out):
                t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        for g, expected in zip(captured, step()):  # dq sums in fp32 atomics: equal up to their order
            torch.testing.assert_close(g, expected)


def test_opcheck_cuda():
    q = torch.randn(2, 9, 4, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 13, 2, 64, device="cuda", dtype=torch.float16)
    for deterministic in (False, True):
        args = (q, k, k.clone(), None, None, None, None, None, 0, 0, 0.0, True, 0, -1, -1, 0.0, 0, deterministic)
        torch.library.opcheck(torch.ops.flashattn.forward.default, args,
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


def test_torch_compile_fullgraph_cuda():
    torch.manual_seed(0)
    q = torch.randn(2, 33, 4, 64, device="cuda", dtype=torch.bfloat16)

    def f(q):
        o = flashattn.attention(q, q, q, causal=True)
        return compat.scaled_dot_product_attention(o.transpose(1, 2), o.transpose(1, 2), o.transpose(1, 2)) * 2

    torch.testing.assert_close(torch.compile(f, fullgraph=True)(q), f(q), atol=0, rtol=0)


def test_cuda_errors_name_the_argument():
    q = torch.randn(1, 8, 2, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="^k: .*cuda"):
        flashattn.attention(q, q.cpu(), q)
    with pytest.raises(TypeError, match="^v: "):
        flashattn.attention(q, q, q.float())
    with pytest.raises(ValueError, match="^backend: "):
        flashattn.attention(q, q, q, backend="cpu")
