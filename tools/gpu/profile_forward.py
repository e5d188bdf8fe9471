#!/usr/bin/env python3
"""One forward launch of ours (the shim, --backend sm80|sm90) and one of SDPA's cuDNN backend on the same
inputs (bf16, 16k tokens, hidden 2048), for Nsight Compute: warm-up calls run first, outside the
profiled range, then each kernel once inside cudaProfilerStart/Stop.

    ncu --profile-from-start off --clock-control none --metrics ... \\
        python3 tools/gpu/profile_forward.py --lib build/gpu/tools/gpu/libflashattn_shim.so --dim 128 --seqlen 8192
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sdpa import SM80, SM90, Ours  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="path of a libflashattn_shim.so")
    ap.add_argument("--backend", choices=["sm80", "sm90"], default="sm90")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--batch", type=int, help="batch size (default 16384 / seqlen, at least 1)")
    ap.add_argument("--no-split", action="store_true", help="sm90 without the split tail (FLASHATTN_SM90_SPLIT=0)")
    args = ap.parse_args()
    ours = Ours(args.lib)
    backend = SM90 if args.backend == "sm90" else SM80
    n, d = args.seqlen, args.dim
    b, h = args.batch or max(1, 16384 // n), 2048 // d
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)

    for _ in range(3):
        ours(q, k, v, o, None, args.causal, backend=backend, split=not args.no_split)
        ref = cudnn()
    torch.cuda.synchronize()
    err = (o.float() - ref.transpose(1, 2).float()).abs().max().item()
    print(f"b{b} h{h} n{n} d{d} causal={args.causal}: max |ours - cuDNN| = {err:.3g}", flush=True)
    if not err < 0.05:
        sys.exit("ours and cuDNN disagree")
    torch.cuda.cudart().cudaProfilerStart()
    ours(q, k, v, o, None, args.causal, backend=backend, split=not args.no_split)
    cudnn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
