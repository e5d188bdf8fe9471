"""Other DLPack arrays: JAX on the CPU and CuPy on a GPU come back as their own array type.
Each test is skipped when its framework (or, for CuPy, a CUDA build and device) is missing."""

import numpy as np
import pytest

import attention_reference as ref
import flashattn
from test_numpy import GRAD_TOL, TOL, assert_close


def test_jax_cpu_arrays():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    rng = ref.seed_rng()
    q = rng.standard_normal((2, 21, 4, 32)).astype(np.float32)
    k = rng.standard_normal((2, 30, 2, 32)).astype(np.float32)
    bias = rng.standard_normal((21, 30)).astype(np.float32)
    qj, kj, bj = jnp.asarray(q), jnp.asarray(k), jnp.asarray(bias)
    out, lse = flashattn.attention(qj, kj, kj, causal=True, bias=bj, return_lse=True)
    assert isinstance(out, jax.Array) and isinstance(lse, jax.Array)
    out_ref, lse_ref = ref.forward(q, k, k, causal=True, bias=bias)
    assert_close(np.asarray(out), out_ref, TOL[np.float32], "out")
    assert_close(np.asarray(lse), lse_ref, TOL[np.float32], "lse")
    grads = flashattn.attention_backward(jnp.ones_like(out), qj, kj, kj, out, lse, causal=True, bias=bj)
    assert all(isinstance(g, jax.Array) for g in grads)
    dq_ref, dk_ref, dv_ref = ref.backward(np.ones(out.shape, np.float32), q, k, k, causal=True, bias=bias)
    for name, g, g_ref in (("dq", grads[0], dq_ref), ("dk", grads[1], dk_ref), ("dv", grads[2], dv_ref)):
        assert_close(np.asarray(g), g_ref, GRAD_TOL[np.float32], name)


def test_cupy_gpu_arrays():
    cupy = pytest.importorskip("cupy")
    if not flashattn.HAS_CUDA or cupy.cuda.runtime.getDeviceCount() == 0:
        pytest.skip("needs a CUDA build of flashattn and a GPU")
    rng = ref.seed_rng()
    q = rng.standard_normal((1, 40, 4, 64)).astype(np.float16)
    qc = cupy.asarray(q)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        out = flashattn.attention(qc, qc, qc, causal=True)
    stream.synchronize()
    assert isinstance(out, cupy.ndarray) and out.dtype == np.float16
    assert_close(cupy.asnumpy(out), ref.forward(q, q, q, causal=True)[0], (2e-3, 2e-3), "out")
