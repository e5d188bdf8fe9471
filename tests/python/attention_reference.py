"""Textbook attention in float64 NumPy: the oracle of the Python tests (forward and gradients).

Layout [batch, seqlen, heads, head_dim]; k and v may have fewer heads (GQA). Options as in
flashattn.attention. Rows that see no key give 0 output, -inf LSE and zero gradients.
"""

import os

import numpy as np


def seed_rng(offset=0):
    """A fresh generator; FLASHATTN_TEST_SEED replays a run (the seed is printed on failure)."""
    seed = int(os.environ.get("FLASHATTN_TEST_SEED", np.random.SeedSequence().entropy % 2**31)) + offset
    print(f"FLASHATTN_TEST_SEED={seed - offset}")
    return np.random.default_rng(seed)


def _expand_heads(x, heads_q):
    return np.repeat(x, heads_q // x.shape[2], axis=2)


def _visible(sq, sk, causal, alignment, window):
    """[sq, sk] bool: which keys each query sees through causal and window (mask applied separately)."""
    offset = sk - sq if alignment == "bottom_right" else 0
    i = np.arange(sq)[:, None] + offset
    j = np.arange(sk)[None, :]
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    vis = np.ones((sq, sk), bool)
    if left >= 0:
        vis &= j >= i - left
    if right >= 0:
        vis &= j <= i + right
    return vis, np.abs(i - j)


def _scores(q, k, scale, causal, alignment, window, softcap, alibi_slopes, bias, mask):
    """(s, visible, capped_tanh) with s [b, h, sq, sk] after softcap, ALiBi and bias; -inf where hidden."""
    b, sq, h, d = q.shape
    sk = k.shape[1]
    q64 = q.astype(np.float64)
    k64 = _expand_heads(k.astype(np.float64), h)
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    s = scale * np.einsum("bqhd,bkhd->bhqk", q64, k64)
    t = None
    if softcap > 0:
        t = np.tanh(s / softcap)
        s = softcap * t
    vis, dist = _visible(sq, sk, causal, alignment, window)
    vis = np.broadcast_to(vis, s.shape).copy()
    if alibi_slopes is not None:
        slopes = np.asarray(alibi_slopes, np.float64)
        slopes = np.broadcast_to(slopes if slopes.ndim == 2 else slopes[None], (b, h))
        s = s - slopes[:, :, None, None] * dist[None, None]
    if bias is not None:
        s = s + np.broadcast_to(np.asarray(bias, np.float64), s.shape)
    if mask is not None:
        vis &= np.broadcast_to(np.asarray(mask, bool), s.shape)
    s = np.where(vis, s, -np.inf)
    return s, vis, t


def forward(q, k, v, *, scale=None, causal=False, causal_alignment="bottom_right", window=(-1, -1), softcap=0.0,
            alibi_slopes=None, bias=None, mask=None):
    """(out [b, sq, h, dv] float64, lse [b, h, sq] float64)."""
    h = q.shape[2]
    s, vis, _ = _scores(q, k, scale, causal, causal_alignment, window, softcap, alibi_slopes, bias, mask)
    any_vis = vis.any(axis=-1, keepdims=True)
    m = np.where(any_vis, s.max(axis=-1, keepdims=True, initial=-np.inf, where=vis), 0.0)
    e = np.where(vis, np.exp(s - m), 0.0)
    l = e.sum(axis=-1, keepdims=True)
    p = np.where(any_vis, e / np.where(any_vis, l, 1.0), 0.0)
    v64 = _expand_heads(v.astype(np.float64), h)
    out = np.einsum("bhqk,bkhd->bqhd", p, v64)
    lse = np.where(any_vis[..., 0], (m + np.log(np.where(any_vis, l, 1.0)))[..., 0], -np.inf)
    return out, lse


def backward(grad_out, q, k, v, *, scale=None, causal=False, causal_alignment="bottom_right", window=(-1, -1),
             softcap=0.0, alibi_slopes=None, bias=None, mask=None):
    """(dq, dk, dv) in float64 for loss gradient grad_out [b, sq, h, dv]."""
    b, sq, h, d = q.shape
    hkv = k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    s, vis, t = _scores(q, k, scale, causal, causal_alignment, window, softcap, alibi_slopes, bias, mask)
    out, lse = forward(q, k, v, scale=scale, causal=causal, causal_alignment=causal_alignment, window=window,
                       softcap=softcap, alibi_slopes=alibi_slopes, bias=bias, mask=mask)
    p = np.where(vis, np.exp(s - np.where(np.isfinite(lse), lse, 0.0)[..., None]), 0.0)
    do = grad_out.astype(np.float64)
    v64 = _expand_heads(v.astype(np.float64), h)
    k64 = _expand_heads(k.astype(np.float64), h)
    dv = np.einsum("bhqk,bqhd->bkhd", p, do)
    dp = np.einsum("bqhd,bkhd->bhqk", do, v64)
    delta = np.einsum("bqhd,bqhd->bhq", do, out)[..., None]
    ds = p * (dp - delta)
    if t is not None:
        ds = ds * (1.0 - t * t)
    dq = scale * np.einsum("bhqk,bkhd->bqhd", ds, k64)
    dk = scale * np.einsum("bhqk,bqhd->bkhd", ds, q.astype(np.float64))
    group = h // hkv
    dk = dk.reshape(b, k.shape[1], hkv, group, d).sum(axis=3)
    dv = dv.reshape(b, k.shape[1], hkv, group, v.shape[3]).sum(axis=3)
    return dq, dk, dv
