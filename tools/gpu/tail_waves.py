#!/usr/bin/env python3
"""The backward's tail wave, measured: ours and SDPA flash (FA2) at b = 1, n = 16k, one head dim,
for a few head counts around a wave boundary (d = 64: 128 key blocks a head, so 32 heads are 4096
blocks, 31.03 waves on 132 SMs, and 33 heads exactly 32). With blocks of equal cost the TFLOP/s of
a partly empty last wave drop by its idle share (docs/perf.md, backward v7). Timing as
bench_sdpa.py (time_interleaved).

    python3 tools/gpu/tail_waves.py --lib build/gpu/tools/gpu/libflashattn_shim.so [--dim 64] [--heads 31,32,33,34]
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sdpa import Ours, time_interleaved  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--heads", default="31,32,33,34")
    args = ap.parse_args()
    lib, d, n = Ours(args.lib), args.dim, args.seqlen
    print(f"{'heads':>5} {'ours':>7} {'flash':>7} {'ours/flash':>10}")
    for h in [int(x) for x in args.heads.split(",")]:
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(1, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        o, lse = torch.empty_like(q), torch.empty(1, h, n, device="cuda", dtype=torch.float32)
        lib(q, k, v, o, lse, False)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        ws = torch.empty(max(lib.backward(q, k, v, o, do, lse, dq, dk, dv, False), 1), dtype=torch.uint8,
                         device="cuda")
        qg, kg, vg = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(qg, kg, vg)
        fns = {"ours": lambda: lib.backward(q, k, v, o, do, lse, dq, dk, dv, False, ws),
               "flash": lambda: torch.autograd.grad(out, (qg, kg, vg), do.transpose(1, 2), retain_graph=True)}
        flops = 2.5 * 4 * h * n * n * d
        t = {name: flops / ms / 1e9 for name, ms in time_interleaved(fns).items()}
        print(f"{h:>5} {t['ours']:7.1f} {t['flash']:7.1f} {t['ours'] / t['flash']:10.3f}", flush=True)
        del q, k, v, do, o, lse, dq, dk, dv, ws, qg, kg, vg, out, fns
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
