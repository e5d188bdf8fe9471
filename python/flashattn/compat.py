"""Drop-in replacements: flash-attn's functions (``from flashattn.compat import flash_attn_func``) and
PyTorch's ``scaled_dot_product_attention``, with their signatures, layouts and semantics.

flash-attn: layout [batch, seqlen, heads, head_dim], bottom-right causal alignment, softmax LSE of
shape [batch, heads, seqlen_q] ([heads, total_q] for varlen), ``return_attn_probs=True`` returning
``(out, softmax_lse, None)`` (flashattn never materialises the probabilities). There is no dropout:
``dropout_p`` must be 0. ``deterministic`` applies to the backward (torch autograd), as in flash-attn:
False lets the GPU backward sum dQ with fp32 atomics (and dK/dV of the key blocks it splits to fill
the last wave), so these may differ in their last bits between runs; True makes every gradient
bit-identical from run to run. The CPU backends are
always deterministic.

SDPA: layout [batch, heads, seq, head_dim], top-left ``is_causal``, boolean ``attn_mask`` with True
= attend, float ``attn_mask`` added to the scores, ``enable_gqa`` for fewer key/value heads. A query
row that sees no key gets 0 (PyTorch gives NaN).

transformers (5.x): ``transformers_attention`` is an attention function for its AttentionInterface::

    from transformers import AttentionInterface
    AttentionInterface.register("fa_compat", flashattn.compat.transformers_attention)
    model = LlamaForCausalLM(config); model.set_attn_implementation("fa_compat")

(a name without "flash" in it: transformers takes those for flash-attention kernels from its hub).
"""

from __future__ import annotations

from . import _core, attention, attention_varlen

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func", "scaled_dot_product_attention",
           "transformers_attention"]


def _no_dropout(dropout_p):
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p: flashattn has no dropout, expected 0.0, got {dropout_p!r}")


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn.flash_attn_func: q [batch, seqlen_q, heads, d], k/v [batch, seqlen_k, heads_kv, d]."""
    _no_dropout(dropout_p)
    out, lse = attention(q, k, v, scale=softmax_scale, causal=causal, causal_alignment="bottom_right",
                         window=window_size, softcap=softcap, alibi_slopes=alibi_slopes, return_lse=True,
                         deterministic=deterministic)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn.flash_attn_qkvpacked_func: qkv [batch, seqlen, 3, heads, d] (strided views, no copy)."""
    if getattr(qkv, "ndim", None) != 5 or qkv.shape[2] != 3:
        raise ValueError(f"qkv: expected shape [batch, seqlen, 3, heads, head_dim], got {tuple(getattr(qkv, 'shape', ()))}")
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal, window_size,
                           softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """flash_attn.flash_attn_varlen_func: q [total_q, heads, d], cu_seqlens int32 [batch + 1]."""
    _no_dropout(dropout_p)
    if block_table is not None:
        raise ValueError("block_table: paged KV is not supported yet")
    out, lse = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale=softmax_scale,
                                causal=causal, causal_alignment="bottom_right", window=window_size, softcap=softcap,
                                alibi_slopes=alibi_slopes, return_lse=True, deterministic=deterministic)
    return (out, lse, None) if return_attn_probs else out


def _swap_seq_heads(x):
    """[batch, heads, seq, d] <-> [batch, seq, heads, d] as a strided view."""
    if _core.is_torch(x):
        return x.transpose(1, 2)
    return x.swapaxes(1, 2)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention on [batch, heads, seq, head_dim] inputs."""
    _no_dropout(dropout_p)
    for name, x in (("query", query), ("key", key), ("value", value)):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(f"{name}: expected 4 dimensions [batch, heads, seq, head_dim], got shape "
                             f"{tuple(getattr(x, 'shape', ()))}")
    if is_causal and attn_mask is not None:
        raise ValueError("attn_mask: give attn_mask or is_causal, not both (as PyTorch)")
    if not enable_gqa and key.shape[1] != query.shape[1]:
        raise ValueError(f"key: {key.shape[1]} heads but query has {query.shape[1]}; pass enable_gqa=True for GQA")
    bias = mask = None
    if attn_mask is not None:
        if str(attn_mask.dtype).endswith("bool"):
            mask = attn_mask
        else:
            bias = attn_mask
    out = attention(_swap_seq_heads(query), _swap_seq_heads(key), _swap_seq_heads(value), scale=scale,
                    causal=is_causal, causal_alignment="top_left", bias=bias, mask=mask)
    return _swap_seq_heads(out)


def transformers_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, is_causal=None,
                           **kwargs):
    """An attention function for transformers' AttentionInterface: query [batch, heads, seq_q, d], key and
    value [batch, heads_kv, seq_k, d] (GQA without repeating them); returns (out [batch, seq_q, heads, d],
    None). With no mask (transformers builds none for an implementation without a registered mask
    function) causality comes from ``is_causal`` or ``module.is_causal``, aligned bottom-right as
    transformers' flash-attention path does, so a query block after a KV cache sees the whole cache. A
    mask (registered through AttentionMaskInterface, e.g. transformers' sdpa_mask) is used as SDPA's."""
    _no_dropout(dropout)
    if attention_mask is None:
        causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
        return attention(_swap_seq_heads(query), _swap_seq_heads(key), _swap_seq_heads(value), scale=scaling,
                         causal=bool(causal)), None
    out = scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=True)
    return _swap_seq_heads(out), None
