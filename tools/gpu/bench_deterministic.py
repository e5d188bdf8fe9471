#!/usr/bin/env python3
"""The GPU backward's price of determinism: flashattn.attention_backward with deterministic=False (dQ
added with fp32 atomics) and True (dQ from a kernel of its own, no atomics) on the same inputs, beside
PyTorch SDPA flash's backward, timed together the same way (time_interleaved: CUDA events, median of
rounds in shuffled order after warm-up). Also checks
that two deterministic runs give the same bits. bf16, 16k total tokens, hidden 2048, as issue 3's grid.

    PYTHONPATH=<site with flashattn> python3 tools/gpu/bench_deterministic.py [--dims 64,128,256] [--seqlens 8192]
"""
import argparse
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn
from bench_sdpa import time_interleaved  # the same timing as the forward/backward benchmark (tools/gpu)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqlens", default="8192")
    args = ap.parse_args()
    rows = []
    for d in [int(x) for x in args.dims.split(",")]:
        for n in [int(x) for x in args.seqlens.split(",")]:
            for causal in (False, True):
                b, h = 16384 // n, 2048 // d
                torch.manual_seed(0)
                q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                out, lse = flashattn.attention(q, k, v, causal=causal, return_lse=True)
                flops = 2.5 * 4 * b * h * n * n * d * (0.5 if causal else 1.0)
                fns = {det: (lambda det=det: flashattn.attention_backward(do, q, k, v, out, lse, causal=causal,
                                                                          deterministic=det))
                       for det in (False, True)}
                first, again = fns[True](), fns[True]()
                same = all(torch.equal(a, b_) for a, b_ in zip(first, again))
                qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    o_ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                dot = do.transpose(1, 2)
                fns["flash"] = lambda: torch.autograd.grad(o_ref, (qt, kt, vt), dot, retain_graph=True)
                tflops = {name: flops / ms / 1e9 for name, ms in time_interleaved(fns).items()}
                rows.append([d, n, causal, tflops[False], tflops[True], same, tflops["flash"]])
                del q, k, v, do, out, lse, qt, kt, vt, o_ref, first
                torch.cuda.empty_cache()
    print("backward TFLOP/s, bf16, 16k tokens, hidden 2048: atomics vs deterministic vs SDPA flash")
    print(f"{'d':>4} {'n':>6} {'causal':>6} {'atomic':>7} {'determ':>7} {'same bits':>9} {'flash':>7} {'determ/flash':>12}")
    ok = True
    for d, n, causal, t_atomic, t_det, same, t_flash in rows:
        ok &= same
        print(f"{d:>4} {n:>6} {str(causal):>6} {t_atomic:7.1f} {t_det:7.1f} {str(same):>9} {t_flash:7.1f} {t_det / t_flash:12.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
