"""flashattn on NumPy arrays against the float64 reference: forward, gradients, every option, every
CPU backend, bf16/fp16, broadcasting, varlen, flash-attn/SDPA compatibility and bad input."""

import subprocess
import sys

import numpy as np
import pytest

import attention_reference as ref
import flashattn
from flashattn import compat

# |flashattn - fp64 reference| <= ATOL + RTOL * |reference|, per storage dtype (inputs rounded first).
TOL = {np.float32: (2e-5, 2e-4), np.float16: (2e-3, 2e-3), "bfloat16": (1.5e-2, 1.5e-2)}
GRAD_TOL = {np.float32: (1e-4, 1e-3), np.float16: (1e-2, 1e-2), "bfloat16": (6e-2, 6e-2)}

OPTIONS = {
    "plain": {},
    "causal": {"causal": True},
    "causal_top_left": {"causal": True, "causal_alignment": "top_left"},
    "window": {"window": (9, 4)},
    "window_left_causal": {"window": (13, -1), "causal": True},
    "scale_softcap": {"scale": 0.3, "softcap": 2.5},
    "alibi_heads": {"alibi": "heads", "causal": True},
    "alibi_batch_heads": {"alibi": "batch_heads"},
    "bias_full": {"bias": "full"},
    "bias_rows": {"bias": "rows"},
    "mask_keys": {"mask": "keys"},
    "mask_full_bias_head": {"mask": "full", "bias": "head", "window": (20, 20)},
    "everything": {"causal": True, "causal_alignment": "top_left", "window": (17, -1), "softcap": 4.0,
                   "alibi": "heads", "bias": "full", "mask": "keys", "scale": 0.2},
}

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v): no tile multiples, Sq != Sk, GQA.
SHAPES = [(2, 37, 50, 4, 2, 64, 64), (1, 77, 33, 3, 1, 40, 40), (3, 1, 129, 2, 2, 16, 24),
          (1, 127, 127, 6, 3, 128, 128)]


def make_problem(rng, shape, option, dtype=np.float32):
    b, sq, sk, h, hkv, d, dv = shape
    q = rng.standard_normal((b, sq, h, d)).astype(dtype)
    k = rng.standard_normal((b, sk, hkv, d)).astype(dtype)
    v = rng.standard_normal((b, sk, hkv, dv)).astype(dtype)
    kw = {key: val for key, val in option.items() if key not in ("alibi", "bias", "mask")}
    if option.get("alibi") == "heads":
        kw["alibi_slopes"] = rng.uniform(0.05, 0.5, h).astype(np.float32)
    elif option.get("alibi") == "batch_heads":
        kw["alibi_slopes"] = rng.uniform(0.05, 0.5, (b, h)).astype(np.float32)
    bias_shapes = {"full": (b, h, sq, sk), "rows": (sq, 1), "head": (1, h, 1, sk)}
    if "bias" in option:
        kw["bias"] = rng.standard_normal(bias_shapes[option["bias"]]).astype(np.float32)
    if option.get("mask") == "keys":
        m = rng.random((b, 1, 1, sk)) < 0.8
        m[..., 0] = True
        kw["mask"] = m
    elif option.get("mask") == "full":
        kw["mask"] = rng.random((b, h, sq, sk)) < 0.7
    return q, k, v, kw


def assert_close(actual, expected, tol, name):
    atol, rtol = tol
    actual = np.asarray(actual, np.float64)
    with np.errstate(invalid="ignore"):  # -inf - -inf where both are -inf: compared through isfinite
        err = np.abs(actual - expected)
    bound = atol + rtol * np.abs(expected)
    finite = np.isfinite(expected)
    assert np.array_equal(np.isfinite(actual), finite), f"{name}: non-finite entries differ"
    worst = np.max(np.where(finite, err / bound, 0.0), initial=0.0)
    assert worst <= 1.0, f"{name}: max error {np.max(np.where(finite, err, 0.0))} exceeds tolerance by {worst:.2f}x"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("option", list(OPTIONS.values()), ids=list(OPTIONS))
def test_forward_and_gradients_match_reference(shape, option):
    rng = ref.seed_rng()
    q, k, v, kw = make_problem(rng, shape, option)
    out, lse = flashattn.attention(q, k, v, return_lse=True, **kw)
    assert type(out) is np.ndarray and out.dtype == np.float32 and lse.dtype == np.float32
    assert out.shape == shape[:2] + (shape[3], shape[6]) and lse.shape == (shape[0], shape[3], shape[1])
    out_ref, lse_ref = ref.forward(q, k, v, **kw)
    assert_close(out, out_ref, TOL[np.float32], "out")
    assert_close(lse, lse_ref, TOL[np.float32], "lse")

    grad_out = rng.standard_normal(out.shape).astype(np.float32)
    dq, dk, dv = flashattn.attention_backward(grad_out, q, k, v, out, lse, **kw)
    dq_ref, dk_ref, dv_ref = ref.backward(grad_out, q, k, v, **kw)
    for name, g, g_ref, x in (("dq", dq, dq_ref, q), ("dk", dk, dk_ref, k), ("dv", dv, dv_ref, v)):
        assert g.shape == x.shape and g.dtype == x.dtype
        assert_close(g, g_ref, GRAD_TOL[np.float32], name)


@pytest.mark.parametrize("backend", ["cpu", "reference", "standard"])
def test_every_cpu_backend(backend):
    rng = ref.seed_rng()
    q, k, v, kw = make_problem(rng, (2, 45, 31, 4, 2, 32, 32), OPTIONS["everything"])
    out, lse = flashattn.attention(q, k, v, return_lse=True, backend=backend, **kw)
    out_ref, lse_ref = ref.forward(q, k, v, **kw)
    assert_close(out, out_ref, TOL[np.float32], "out")
    grad_out = rng.standard_normal(out.shape).astype(np.float32)
    grads = flashattn.attention_backward(grad_out, q, k, v, out, lse, backend=backend, **kw)
    for name, g, g_ref in zip(("dq", "dk", "dv"), grads, ref.backward(grad_out, q, k, v, **kw)):
        assert_close(g, g_ref, GRAD_TOL[np.float32], name)


def _half_dtypes():
    dtypes = [pytest.param(np.float16, id="float16")]
    try:
        import ml_dtypes
        dtypes.append(pytest.param(ml_dtypes.bfloat16, id="bfloat16"))
    except ImportError:
        dtypes.append(pytest.param(None, id="bfloat16", marks=pytest.mark.skip(reason="ml_dtypes not installed")))
    return dtypes


@pytest.mark.parametrize("dtype", _half_dtypes())
@pytest.mark.parametrize("option", ["causal", "everything"])
def test_half_precision(dtype, option):
    rng = ref.seed_rng()
    q, k, v, kw = make_problem(rng, (2, 41, 66, 4, 1, 64, 64), OPTIONS[option], dtype=dtype)
    key = np.float16 if dtype == np.float16 else "bfloat16"
    out, lse = flashattn.attention(q, k, v, return_lse=True, **kw)
    assert out.dtype == dtype
    out_ref, lse_ref = ref.forward(q, k, v, **kw)
    assert_close(out, out_ref, TOL[key], "out")
    assert_close(lse, lse_ref, TOL[np.float32], "lse")
    grad_out = rng.standard_normal(out.shape).astype(dtype)
    grads = flashattn.attention_backward(grad_out, q, k, v, out, lse, **kw)
    # the reference differentiates at its own float64 output; the half-precision out adds rounding
    for name, g, g_ref in zip(("dq", "dk", "dv"), grads, ref.backward(grad_out, q, k, v, **kw)):
        assert g.dtype == dtype
        assert_close(g, g_ref, GRAD_TOL[key], name)


def test_bfloat16_bias():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = ref.seed_rng()
    q, k, v, kw = make_problem(rng, (1, 20, 30, 2, 2, 32, 32), {})
    bias = rng.standard_normal((1, 2, 20, 30)).astype(ml_dtypes.bfloat16)
    out = flashattn.attention(q, k, v, bias=bias)
    assert_close(out, ref.forward(q, k, v, bias=bias.astype(np.float32))[0], TOL[np.float32], "out")


@pytest.mark.parametrize("form", ["1d_keys", "2d_rows_broadcast_last", "3d", "broadcast_to_stride0", "int8_mask"])
def test_broadcast_bias_and_mask(form):
    rng = ref.seed_rng()
    b, sq, sk, h = 2, 19, 23, 3
    q, k, v, _ = make_problem(rng, (b, sq, sk, h, h, 16, 16), {})
    if form == "1d_keys":
        bias, mask = rng.standard_normal(sk).astype(np.float32), rng.random(sk) < 0.7
    elif form == "2d_rows_broadcast_last":  # last dim of size 1: materialised by the Python layer
        bias, mask = rng.standard_normal((sq, 1)).astype(np.float32), rng.random((sq, 1)) < 0.7
    elif form == "3d":
        bias, mask = rng.standard_normal((h, 1, sk)).astype(np.float32), rng.random((h, sq, sk)) < 0.7
    elif form == "broadcast_to_stride0":  # a zero-stride last dimension is materialised too
        bias = np.broadcast_to(rng.standard_normal((b, 1, sq, 1)).astype(np.float32), (b, 1, sq, sk))
        mask = np.broadcast_to(rng.random((1, h, 1, 1)) < 0.7, (b, h, sq, sk))
    else:
        bias, mask = None, (rng.random((b, 1, sq, sk)) < 0.7).astype(np.uint8)
    out = flashattn.attention(q, k, v, bias=bias, mask=mask)
    out_ref, _ = ref.forward(q, k, v, bias=bias, mask=mask)
    assert_close(out, out_ref, TOL[np.float32], "out")


def test_fully_masked_rows_give_zero_and_minus_inf():
    rng = ref.seed_rng()
    q, k, v, _ = make_problem(rng, (1, 8, 8, 2, 2, 16, 16), {})
    mask = np.ones((8, 8), bool)
    mask[3] = False
    out, lse = flashattn.attention(q, k, v, mask=mask, return_lse=True)
    assert np.all(out[:, 3] == 0) and np.all(lse[:, :, 3] == -np.inf)
    assert np.all(np.isfinite(out))
    dq, dk, dv = flashattn.attention_backward(np.ones_like(out), q, k, v, out, lse, mask=mask)
    assert np.all(dq[:, 3] == 0) and np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))


def test_strided_views_are_used_in_place():
    rng = ref.seed_rng()
    qkv = rng.standard_normal((2, 33, 3, 4, 32)).astype(np.float32)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    assert not q.flags.c_contiguous
    out = flashattn.attention(q, k, v, causal=True)
    assert_close(out, ref.forward(q, k, v, causal=True)[0], TOL[np.float32], "out")
    # read-only inputs are fine (nothing writes them)
    qkv.setflags(write=False)
    out2 = flashattn.attention(q, k, v, causal=True)
    assert np.array_equal(out, out2)


def test_results_are_deterministic():
    rng = ref.seed_rng()
    q, k, v, kw = make_problem(rng, (2, 65, 70, 4, 2, 64, 64), OPTIONS["everything"])
    out1, lse1 = flashattn.attention(q, k, v, return_lse=True, **kw)
    out2, lse2 = flashattn.attention(q, k, v, return_lse=True, **kw)
    assert np.array_equal(out1, out2) and np.array_equal(lse1, lse2)


def test_deterministic_backward_argument(monkeypatch):
    """attention_backward(deterministic=...) reaches the C++ backward; the CPU gives the same bits either way."""
    seen = []
    real = flashattn._ext.backward
    monkeypatch.setattr(flashattn._ext, "backward", lambda *a, **kw: seen.append(kw["deterministic"]) or real(*a, **kw))
    rng = ref.seed_rng()
    q, k, v, kw = make_problem(rng, (2, 33, 40, 4, 2, 32, 32), OPTIONS["causal"])
    out, lse = flashattn.attention(q, k, v, return_lse=True, **kw)
    grad_out = rng.standard_normal(out.shape).astype(np.float32)
    plain = flashattn.attention_backward(grad_out, q, k, v, out, lse, **kw)
    det = flashattn.attention_backward(grad_out, q, k, v, out, lse, deterministic=True, **kw)
    assert seen == [False, True]
    for a, b in zip(plain, det):
        assert np.array_equal(a, b)


def _varlen_problem(rng, lens_q, lens_k, h=4, hkv=2, d=32):
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = rng.standard_normal((cu_q[-1], h, d)).astype(np.float32)
    k = rng.standard_normal((cu_k[-1], hkv, d)).astype(np.float32)
    v = rng.standard_normal((cu_k[-1], hkv, d)).astype(np.float32)
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_matches_per_sequence(causal):
    rng = ref.seed_rng()
    lens_q, lens_k = [5, 0, 37, 12], [9, 4, 30, 12]
    q, k, v, cu_q, cu_k = _varlen_problem(rng, lens_q, lens_k)
    out, lse = flashattn.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                          return_lse=True)
    assert out.shape == q.shape and lse.shape == (q.shape[1], q.shape[0])
    grad_out = rng.standard_normal(out.shape).astype(np.float32)
    dq, dk, dv = flashattn.attention_varlen_backward(grad_out, q, k, v, out, lse, cu_q, cu_k, max(lens_q),
                                                     max(lens_k), causal=causal)
    for bi in range(len(lens_q)):
        sq, sk = slice(cu_q[bi], cu_q[bi + 1]), slice(cu_k[bi], cu_k[bi + 1])
        if lens_q[bi] == 0:
            continue
        o_ref, l_ref = ref.forward(q[None, sq], k[None, sk], v[None, sk], causal=causal)
        assert_close(out[sq], o_ref[0], TOL[np.float32], f"out[{bi}]")
        assert_close(lse[:, sq], l_ref[0], TOL[np.float32], f"lse[{bi}]")
        g_ref = ref.backward(grad_out[None, sq], q[None, sq], k[None, sk], v[None, sk], causal=causal)
        for name, g, gr, rows in (("dq", dq, g_ref[0], sq), ("dk", dk, g_ref[1], sk), ("dv", dv, g_ref[2], sk)):
            assert_close(g[rows], gr[0], GRAD_TOL[np.float32], f"{name}[{bi}]")


# --- flashattn.compat on NumPy ---

def test_flash_attn_func_semantics():
    rng = ref.seed_rng()
    q, k, v, _ = make_problem(rng, (2, 30, 45, 4, 2, 32, 32), {})
    slopes = rng.uniform(0.1, 0.3, 4).astype(np.float32)
    out, lse, probs = compat.flash_attn_func(q, k, v, softmax_scale=0.25, causal=True, window_size=(10, 3),
                                             softcap=3.0, alibi_slopes=slopes, return_attn_probs=True)
    assert probs is None and lse.shape == (2, 4, 30)
    kw = dict(scale=0.25, causal=True, causal_alignment="bottom_right", window=(10, 3), softcap=3.0,
              alibi_slopes=slopes)
    out_ref, lse_ref = ref.forward(q, k, v, **kw)
    assert_close(out, out_ref, TOL[np.float32], "out")
    assert_close(lse, lse_ref, TOL[np.float32], "lse")
    assert np.array_equal(compat.flash_attn_func(q, k, v, 0.0, 0.25, True, (10, 3), 3.0, slopes), out)
    with pytest.raises(ValueError, match="dropout_p"):
        compat.flash_attn_func(q, k, v, dropout_p=0.1)


def test_flash_attn_qkvpacked_and_varlen():
    rng = ref.seed_rng()
    qkv = rng.standard_normal((2, 26, 3, 2, 16)).astype(np.float32)
    out = compat.flash_attn_qkvpacked_func(qkv, causal=True)
    assert_close(out, ref.forward(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)[0], TOL[np.float32], "out")

    q, k, v, cu_q, cu_k = _varlen_problem(rng, [7, 20], [11, 20])
    out, lse, _ = compat.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 20, 20, causal=True, return_attn_probs=True)
    assert lse.shape == (4, 27)
    o_ref, _ = ref.forward(q[None, :7], k[None, :11], v[None, :11], causal=True)
    assert_close(out[:7], o_ref[0], TOL[np.float32], "out")


@pytest.mark.parametrize("case", ["causal", "bool_mask", "float_mask", "gqa"])
def test_sdpa_semantics(case):
    rng = ref.seed_rng()
    b, h, sq, sk, d = 2, 4, 21, 34, 32
    query = rng.standard_normal((b, h, sq, d)).astype(np.float32)
    hkv = 2 if case == "gqa" else h
    key = rng.standard_normal((b, hkv, sk, d)).astype(np.float32)
    value = rng.standard_normal((b, hkv, sk, d)).astype(np.float32)
    kw, ref_kw = {}, {}
    if case == "causal":
        kw, ref_kw = {"is_causal": True}, {"causal": True, "causal_alignment": "top_left"}
    elif case == "bool_mask":
        m = rng.random((b, 1, sq, sk)) < 0.6
        m[..., 0] = True
        kw, ref_kw = {"attn_mask": m}, {"mask": m}
    elif case == "float_mask":
        m = rng.standard_normal((sq, sk)).astype(np.float32)
        kw, ref_kw = {"attn_mask": m, "scale": 0.5}, {"bias": m, "scale": 0.5}
    else:
        kw = {"enable_gqa": True}
        with pytest.raises(ValueError, match="enable_gqa"):
            compat.scaled_dot_product_attention(query, key, value)
    out = compat.scaled_dot_product_attention(query, key, value, **kw)
    assert out.shape == (b, h, sq, d)
    t = lambda x: x.swapaxes(1, 2)  # noqa: E731
    out_ref, _ = ref.forward(t(query), t(key), t(value), **ref_kw)
    assert_close(t(out), out_ref, TOL[np.float32], "out")


# --- bad input: ValueError / TypeError naming the argument, never a crash ---

def _qkv(rng=None, dtype=np.float32):
    rng = rng or np.random.default_rng(0)
    return (rng.standard_normal((2, 10, 4, 16)).astype(dtype), rng.standard_normal((2, 12, 2, 16)).astype(dtype),
            rng.standard_normal((2, 12, 2, 16)).astype(dtype))


BAD_INPUTS = {
    "mixed_dtypes": (lambda q, k, v: ((q, k.astype(np.float16), v), {}), TypeError, "^k: "),
    "float64": (lambda q, k, v: ((q.astype(np.float64), k, v), {}), TypeError, "^q: .*float64"),
    "int_q": (lambda q, k, v: ((q.astype(np.int32), k, v), {}), TypeError, "^q: "),
    "last_dim_strided": (lambda q, k, v: ((np.asfortranarray(q), k, v), {}), ValueError, "^q: .*contiguous"),
    "v_seqlen": (lambda q, k, v: ((q, k, v[:, :5]), {}), ValueError, "^v: "),
    "k_head_dim": (lambda q, k, v: ((q, k[..., :8], v), {}), ValueError, "^k: "),
    "k_batch": (lambda q, k, v: ((q, k[:1], v[:1]), {}), ValueError, "^k: "),
    "gqa_ratio": (lambda q, k, v: ((q, np.concatenate([k, k[:, :, :1]], 2), np.concatenate([v, v[:, :, :1]], 2)), {}),
                  ValueError, "^k: "),
    "q_3d": (lambda q, k, v: ((q[0], k, v), {}), ValueError, "^q: "),
    "head_dim_too_large": (lambda q, k, v: ((np.zeros((1, 2, 1, 520), np.float32),) * 3, {}), ValueError,
                           "^q, k: "),
    "mask_shape": (lambda q, k, v: ((q, k, v), {"mask": np.ones((3, 10, 12), bool)}), ValueError, "^mask: "),
    "mask_dtype": (lambda q, k, v: ((q, k, v), {"mask": np.ones((10, 12), np.float32)}), TypeError, "^mask: "),
    "bias_dtype": (lambda q, k, v: ((q, k, v), {"bias": np.ones((10, 12), np.float64)}), TypeError, "^bias: "),
    "bias_5d": (lambda q, k, v: ((q, k, v), {"bias": np.ones((1, 2, 4, 10, 12), np.float32)}), ValueError, "^bias: "),
    "alibi_shape": (lambda q, k, v: ((q, k, v), {"alibi_slopes": np.ones(3, np.float32)}), ValueError,
                    "^alibi_slopes: "),
    "alibi_dtype": (lambda q, k, v: ((q, k, v), {"alibi_slopes": np.ones(4, np.float64)}), TypeError,
                    "^alibi_slopes: "),
    "alignment": (lambda q, k, v: ((q, k, v), {"causal_alignment": "top"}), ValueError, "^causal_alignment: "),
    "window": (lambda q, k, v: ((q, k, v), {"window": (-2, 0)}), ValueError, "^window: "),
    "window_type": (lambda q, k, v: ((q, k, v), {"window": 5}), ValueError, "^window: "),
    "softcap": (lambda q, k, v: ((q, k, v), {"softcap": -1.0}), ValueError, "^softcap: "),
    "scale": (lambda q, k, v: ((q, k, v), {"scale": float("nan")}), ValueError, "^scale: "),
    "backend": (lambda q, k, v: ((q, k, v), {"backend": "tpu"}), ValueError, "^backend: "),
    "gpu_backend_on_cpu": (lambda q, k, v: ((q, k, v), {"backend": "cuda-sm80"}), ValueError, "^backend: "),
    "k_not_array": (lambda q, k, v: ((q, k.tolist(), v), {}), TypeError, "^k: "),
    "q_not_array": (lambda q, k, v: (([1.0], k, v), {}), TypeError, "^q: "),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_names_the_argument(case):
    make, error, pattern = BAD_INPUTS[case]
    args, kw = make(*_qkv())
    with pytest.raises(error, match=pattern):
        flashattn.attention(*args, **kw)


def test_bad_backward_input_names_the_argument():
    q, k, v = _qkv()
    out, lse = flashattn.attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="^lse: "):
        flashattn.attention_backward(out, q, k, v, out, lse[:, :, :5])
    with pytest.raises(ValueError, match="^grad_out: "):
        flashattn.attention_backward(out[:, :5], q, k, v, out, lse)
    with pytest.raises(TypeError, match="^grad_out: "):
        flashattn.attention_backward(out.astype(np.float16), q, k, v, out, lse)
    with pytest.raises(TypeError, match="^lse: "):
        flashattn.attention_backward(out, q, k, v, out, lse.astype(np.float16))


def test_bad_varlen_input_names_the_argument():
    rng = np.random.default_rng(0)
    q, k, v, cu_q, cu_k = _varlen_problem(rng, [3, 4], [5, 6])
    with pytest.raises(TypeError, match="^cu_seqlens_q: "):
        flashattn.attention_varlen(q, k, v, cu_q.astype(np.int64), cu_k, 4, 6)
    with pytest.raises(ValueError, match="^cu_seqlens_q: "):
        flashattn.attention_varlen(q, k, v, cu_q[::-1].copy(), cu_k, 4, 6)
    with pytest.raises(ValueError, match="^cu_seqlens_k: "):
        flashattn.attention_varlen(q, k, v, cu_q, cu_k, 4, 5)  # a sequence longer than max_seqlen_k
    with pytest.raises(ValueError, match="^cu_seqlens_k: "):
        flashattn.attention_varlen(q, k, v, cu_q, cu_k[:2], 4, 6)


def test_import_does_not_need_torch():
    code = ("import sys; sys.modules['torch'] = None\n"  # any `import torch` now fails
            "import numpy as np, flashattn, flashattn.compat\n"
            "x = np.ones((1, 4, 1, 8), np.float32)\n"
            "assert flashattn.attention(x, x, x).shape == (1, 4, 1, 8)\n"
            "print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
