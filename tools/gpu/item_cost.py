#!/usr/bin/env python3
"""What one work item of the sm90 forward costs, beside cuDNN: whole waves of the persistent grid
(d = 128, non-causal, bf16; 33 query tiles of 128 rows x h heads = 132 h / 4 items, h = 4, 8, 12: one,
two and three items per block on 132 SMs), over key lengths (T = sk / 128 key tiles per item). One
more wave adds one item to every block, so the slope of time over waves is the time of one item, with
nothing of the launch, the first loads or a partial wave in it; its fit over T gives the time per key
tile and the fixed cost per item (Q load, the first S without a P V beside it, the last P V alone, the
epilogue). --cold: each call takes the next of 8 input sets, so that no call finds its inputs in L2
(without it, the few MB of a shape stay in L2 from one call to the next). Timing as bench_sdpa.py
(time_interleaved); each output is checked against cuDNN's. For cuDNN a call shorter than its host
overhead (one wave at small T) reads as that overhead: read its slopes from the larger T.

    python3 tools/gpu/item_cost.py --lib build/gpu/tools/gpu/libflashattn_shim.so [--cold]
"""
import argparse
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sdpa import SM90, Ours, time_interleaved  # noqa: E402

WAVE_HEADS = (4, 8, 12)  # x 33 query tiles: 132, 264, 396 items


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", action="append", required=True, help="name=path (or path) of a libflashattn_shim.so")
    ap.add_argument("--seqlens-k", default="2048,4096,8192,16384")
    ap.add_argument("--cold", action="store_true", help="8 input sets in turn: no inputs left in L2")
    args = ap.parse_args()
    libs = {}
    for i, spec in enumerate(args.lib):
        name, _, path = spec.rpartition("=")
        libs[name or f"ours{i}"] = Ours(path)
    torch.manual_seed(0)
    d, sq = 128, 33 * 128
    sets = 8 if args.cold else 1
    fits = {}
    print(f"{'cold' if args.cold else 'warm'} inputs; item = slope of time over 1-3 waves (one item per block)")
    print(f"{'':8} {'T':>4} {'1 wave':>9} {'2 waves':>9} {'3 waves':>9} {'item us':>9} {'us/tile':>8}")
    for sk in (int(x) for x in args.seqlens_k.split(",")):
        times = {}
        for h in WAVE_HEADS:
            data = []
            for _ in range(sets):
                q, k, v = (torch.randn(1, n, h, d, device="cuda", dtype=torch.bfloat16) for n in (sq, sk, sk))
                data.append((q, k, v, torch.empty_like(q)) + tuple(x.transpose(1, 2) for x in (q, k, v)))
            turn = [0]

            def next_set():
                turn[0] = (turn[0] + 1) % sets
                return data[turn[0]]

            def cudnn():
                qt, kt, vt = next_set()[4:]
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(qt, kt, vt)

            fns = {"cudnn": cudnn}
            ref = cudnn_ref(data[0])  # one reference for every build
            for name, lib in libs.items():
                q, k, v, o = data[0][:4]
                lib(q, k, v, o, None, False, backend=SM90)
                err = (o.float() - ref.float()).abs().max().item()
                if not err < 0.05:
                    sys.exit(f"{name}: differs from cuDNN by {err} (sk {sk}, h {h})")

                def ours(lib=lib):
                    q, k, v, o = next_set()[:4]
                    lib(q, k, v, o, None, False, backend=SM90)

                fns[name] = ours
            times[h] = time_interleaved(fns, reps=4, rounds=10)
            del data, ref
        t = sk // 128
        for name in times[WAVE_HEADS[0]]:
            ms = [times[h][name] for h in WAVE_HEADS]
            item = np.polyfit([1, 2, 3], ms, 1)[0] * 1e3
            fits.setdefault(name, []).append((t, item))
            print(f"{name:8} {t:4} " + " ".join(f"{x * 1e3:9.1f}" for x in ms) + f" {item:9.2f} {item / t:8.3f}",
                  flush=True)
    for name, points in fits.items():
        big = [(t, item) for t, item in points if t >= 32] or points
        if len(big) >= 2:
            per_tile, fixed = np.polyfit([t for t, _ in big], [i for _, i in big], 1)
            print(f"{name}: item = {per_tile:.4f} us x T + {fixed:.2f} us (T >= 32): a fixed "
                  f"{fixed / per_tile:.2f} key tiles per item")


def cudnn_ref(entry):
    qt, kt, vt = entry[4:]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(qt, kt, vt).transpose(1, 2)


if __name__ == "__main__":
    main()
