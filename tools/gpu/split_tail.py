#!/usr/bin/env python3
"""The sm90 forward's split tail (src/cuda/sm90/tile_scheduler.cuh), measured: one build's forward
as its rule chooses (`split`; ws MB 0 where the rule does not split) and without the split
(FLASHATTN_SM90_SPLIT=0 around the call) beside cuDNN, non-causal bf16, for
shapes whose work items fill the last wave of the persistent grid to different degrees, and for
decode (one query row per sequence, pack-GQA: one item per (batch, kv head)). Timing as
bench_sdpa.py (time_interleaved); each output is checked against cuDNN's.

    python3 tools/gpu/split_tail.py --lib build/gpu/tools/gpu/libflashattn_shim.so
"""
import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sdpa import SM90, Ours, time_interleaved  # noqa: E402

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim)
SHAPES = [
    (1, 4096, 4096, 5, 5, 128),     # 160 items of 128 rows: 1.21 waves on 132 SMs
    (1, 4096, 4096, 6, 6, 128),     # 192: 1.45
    (1, 4096, 4096, 8, 8, 128),     # 256: 1.94
    (1, 4096, 4096, 9, 9, 128),     # 288: 2.18
    (1, 8192, 8192, 17, 17, 128),   # 1088: 8.24
    (4, 4096, 4096, 16, 16, 128),   # 2048: 15.52 (the benchmark's)
    (2, 8192, 8192, 16, 16, 128),   # 2048 at 8k
    (1, 8192, 8192, 9, 9, 64),      # 387 items of 192 rows: 2.93
    (2, 4096, 4096, 9, 9, 256),     # 576 items of 128 rows: 4.36
    (70, 1, 8192, 16, 2, 128),      # decode, 140 items
    (100, 1, 16384, 32, 2, 128),    # decode, 200 items
    (40, 1, 32768, 32, 4, 128),     # decode, 160 items
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    args = ap.parse_args()
    lib = Ours(args.lib)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"device: {torch.cuda.get_device_name()}, {sms} SMs; sm90 forward TFLOP/s, bf16, non-causal")
    print(f"{'b':>4} {'sq':>5} {'sk':>6} {'hq':>3} {'hkv':>3} {'d':>4} {'items':>6} {'waves':>6} {'cudnn':>7} "
          f"{'ws MB':>6} {'split':>7} {'plain':>7} {'split/plain':>11} {'split/cudnn':>11}")
    for b, sq, sk, hq, hkv, d in SHAPES:
        torch.manual_seed(0)
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        group = hq // hkv
        block_m = 192 if d == 64 else 128
        rows, heads = (sq * group, hkv) if sq * group <= block_m // 2 else (sq, hq)  # pack-GQA for decode
        items = b * heads * math.ceil(rows / block_m)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=group > 1)

        ref = cudnn().transpose(1, 2).float()
        ws_mb = lib.forward_workspace(q, k, v, torch.empty_like(q), False) / 2**20  # 0: the rule does not split
        outs = {}
        for split in (True, False):
            o = torch.full_like(q, float("nan"))
            lib(q, k, v, o, None, False, backend=SM90, split=split)
            torch.cuda.synchronize()
            err = (o.float() - ref).abs().max().item()
            assert err < 0.05, f"split={split}: max |o - cudnn| = {err}"
            outs[split] = o
        fns = {"cudnn": cudnn,
               "split": lambda: lib(q, k, v, outs[True], None, False, backend=SM90, split=True),
               "plain": lambda: lib(q, k, v, outs[False], None, False, backend=SM90, split=False)}
        flops = 4 * b * hq * sq * sk * d
        t = {name: flops / ms / 1e9 for name, ms in time_interleaved(fns).items()}
        print(f"{b:>4} {sq:>5} {sk:>6} {hq:>3} {hkv:>3} {d:>4} {items:>6} {items / sms:6.2f} {t['cudnn']:7.1f} "
              f"{ws_mb:6.1f} {t['split']:7.1f} {t['plain']:7.1f} {t['split'] / t['plain']:11.3f} {t['split'] / t['cudnn']:11.3f}",
              flush=True)
        del q, k, v, qt, kt, vt, outs, fns, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
