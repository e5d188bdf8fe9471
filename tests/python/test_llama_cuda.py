"""A real model: a small transformers Llama (random weights, built here, nothing downloaded) whose
attention is flashattn.compat.transformers_attention, registered through transformers'
AttentionInterface. Its logits and the gradients of one training step are compared with the same
model in float64 under eager attention, against the error of the same bf16 model under eager
attention: logits by the 2x rule, gradients by the 3x rule (each parameter on its own).
Skipped without torch, transformers, a CUDA device, or a CUDA build of flashattn.
FLASHATTN_LLAMA_DEVICE=cpu runs the same checks on the CPU backend (no GPU needed)."""

import copy
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flashattn  # noqa: E402
from flashattn import compat  # noqa: E402

DEVICE = os.environ.get("FLASHATTN_LLAMA_DEVICE", "cuda")
pytestmark = [
    pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif(DEVICE == "cuda" and not flashattn.HAS_CUDA, reason="flashattn built without CUDA"),
]

IMPL = "fa_compat"  # no "flash" in the name: transformers takes such names for hub flash-attention kernels
BATCH, SEQLEN = 2, 77  # not a tile multiple


def seed():
    s = int(os.environ.get("FLASHATTN_TEST_SEED", torch.seed() % 2**31))
    print(f"[seed] FLASHATTN_TEST_SEED={s}")
    torch.manual_seed(s)
    return s


def set_attention(model, name):
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name


@pytest.fixture(scope="module")
def models():
    """(fp64 eager, bf16 eager, bf16 flashattn) copies of one random model, on the GPU."""
    transformers.AttentionInterface.register(IMPL, compat.transformers_attention)
    seed()
    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                      max_position_embeddings=256, attention_dropout=0.0)
    config._attn_implementation = "eager"
    base = transformers.LlamaForCausalLM(config)
    exact = copy.deepcopy(base).to(device=DEVICE, dtype=torch.float64)
    eager = copy.deepcopy(base).to(device=DEVICE, dtype=torch.bfloat16)
    ours = copy.deepcopy(base).to(device=DEVICE, dtype=torch.bfloat16)
    set_attention(exact, "eager")
    set_attention(eager, "eager")
    set_attention(ours, IMPL)
    assert ours.config._attn_implementation == IMPL and eager.config._attn_implementation == "eager"
    return exact, eager, ours


def max_err(x, exact):
    return (x.double() - exact).abs().max().item()


def batch():
    ids = torch.randint(0, 1000, (BATCH, SEQLEN), device=DEVICE)
    labels = torch.randint(0, 1000, (BATCH, SEQLEN), device=DEVICE)
    return ids, labels


def test_flashattn_is_called(models, monkeypatch):
    """The comparison below means something only if the model really runs flashattn."""
    _, _, ours = models
    calls = []
    real = flashattn.attention
    monkeypatch.setattr(compat, "attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.no_grad():
        ours(batch()[0], use_cache=False)
    assert len(calls) == ours.config.num_hidden_layers


def test_logits_match_eager(models):
    exact, eager, ours = models
    ids, _ = batch()
    with torch.no_grad():
        ref = exact(ids, use_cache=False).logits
        base = max_err(eager(ids, use_cache=False).logits, ref)
        out = ours(ids, use_cache=False).logits
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    err = max_err(out, ref)
    print(f"logits: flashattn error {err:.3g}, eager bf16 error {base:.3g}")
    assert err <= 2 * base + 1e-5, f"logits: flashattn error {err} vs eager bf16 {base}"


def test_training_step_gradients_match_eager(models):
    exact, eager, ours = models
    ids, labels = batch()
    grads = {}
    losses = {}
    for name, model in (("exact", exact), ("eager", eager), ("ours", ours)):
        model.train()
        model.zero_grad(set_to_none=True)
        loss = model(ids, labels=labels, use_cache=False).loss
        loss.backward()
        losses[name] = loss.item()
        grads[name] = {p_name: p.grad for p_name, p in model.named_parameters()}
        model.eval()
    assert abs(losses["ours"] - losses["exact"]) <= 2 * abs(losses["eager"] - losses["exact"]) + 1e-3, losses
    worst = (0.0, "")
    for p_name, g_exact in grads["exact"].items():
        g_ours, g_eager = grads["ours"][p_name], grads["eager"][p_name]
        assert g_ours is not None and torch.isfinite(g_ours).all(), f"{p_name}: no finite gradient"
        err, base = max_err(g_ours, g_exact), max_err(g_eager, g_exact)
        assert err <= 3 * base + 1e-5, f"{p_name}: flashattn gradient error {err} vs eager bf16 {base}"
        worst = max(worst, (err / (base + 1e-5), p_name))
    print(f"losses {losses}; worst gradient error ratio {worst[0]:.2f} ({worst[1]})")


def test_kv_cache_decoding_matches_eager(models):
    """Greedy generation through a KV cache: a prefill of 20 tokens, then one query row per step against
    the cache (bottom-right causal). Each step's logits against the fp64 model run on the whole
    generated sequence without a cache, by the 2x rule against eager bf16 on the same sequence."""
    exact, eager, ours = models
    ids, _ = batch()
    prompt, new = 20, 8
    with torch.no_grad():
        gen = ours.generate(ids[:, :prompt], attention_mask=torch.ones_like(ids[:, :prompt]), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                            output_logits=True, return_dict_in_generate=True)
        seq = gen.sequences
        assert seq.shape == (BATCH, prompt + new)
        steps = torch.stack(gen.logits, dim=1)  # [batch, new, vocab]: step i predicts token prompt + i
        ref = exact(seq, use_cache=False).logits[:, prompt - 1:-1]
        base = max_err(eager(seq, use_cache=False).logits[:, prompt - 1:-1], ref)
    err = max_err(steps, ref)
    print(f"cached decoding logits: flashattn error {err:.3g}, eager bf16 (no cache) error {base:.3g}")
    assert err <= 2 * base + 1e-5, f"cached decoding: flashattn error {err} vs eager bf16 {base}"
