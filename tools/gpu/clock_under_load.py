#!/usr/bin/env python3
"""The SM clock and board power while one forward runs back to back for a few seconds, for ours
(sm90) and SDPA's cuDNN backend on the benchmark's shapes (bf16, 16k tokens, hidden 2048,
non-causal unless --causal), sampled by `nvidia-smi --query-gpu=clocks.sm,power.draw -lms 20`.
Each window's first 0.3 s is dropped, so that the clock has settled. The question it answers
(docs/perf.md, "What an item costs"): is the time per key tile of a long call different at n = 4k and
at 16k because the clock differs? That is, does a tile cost more energy in one than in the other?

Written in session 19 (2026-12-03). It first ran in session 20: both kernels are held at about 690 W,
and ours ran at 1665 MHz at n = 4k and 1620 at 16k (docs/perf.md, "An item's fixed cost").

    python3 tools/gpu/clock_under_load.py --lib build/gpu/tools/gpu/libflashattn_shim.so
"""
import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sdpa import SM90, Ours, benchmark_inputs  # noqa: E402

SETTLE_S = 0.3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="path of a libflashattn_shim.so")
    ap.add_argument("--dims", default="128")
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--seconds", type=float, default=1.5, help="length of each window")
    ap.add_argument("--passes", type=int, default=2, help="windows per (shape, kernel), interleaved")
    ap.add_argument("--causal", action="store_true")
    args = ap.parse_args()
    ours = Ours(args.lib)
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "20"], stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    windows = []
    try:
        for _ in range(args.passes):
            for d in (int(x) for x in args.dims.split(",")):
                for n in (int(x) for x in args.seqlens.split(",")):
                    q, k, v, o, (qt, kt, vt) = benchmark_inputs(n, d)

                    def cudnn():
                        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)

                    def sm90():
                        ours(q, k, v, o, None, args.causal, backend=SM90)

                    sm90()
                    err = (o.float() - cudnn().transpose(1, 2).float()).abs().max().item()
                    if not err < 0.05:
                        sys.exit(f"ours and cuDNN disagree by {err} (d {d}, n {n})")
                    flops = 4 * q.numel() * n // (2 if args.causal else 1)  # 4 b h n n d
                    for name, fn in (("sm90", sm90), ("cudnn", cudnn)):
                        windows.append((d, n, name) + run_window(fn, args.seconds, flops))
                        time.sleep(0.3)
                    del q, k, v, o, qt, kt, vt
    finally:
        time.sleep(0.2)
        smi.terminate()
    samples = []
    for line in smi.communicate()[0].strip().splitlines():
        try:
            stamp, clock, power = (x.strip() for x in line.split(","))
            samples.append((datetime.datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f"), float(clock), float(power)))
        except ValueError:
            continue
    print(f"non-causal: {not args.causal}; clock and power: medians of nvidia-smi samples every 20 ms")
    print(f"{'d':>4} {'n':>6} {'kernel':>6} {'TFLOP/s':>8} {'MHz':>6} {'W':>6} {'samples':>7}")
    for d, n, name, t0, t1, tflops in windows:
        inside = [(c, p) for t, c, p in samples if t0 + datetime.timedelta(seconds=SETTLE_S) <= t <= t1]
        clock = f"{statistics.median(c for c, _ in inside):6.0f}" if inside else "     -"
        power = f"{statistics.median(p for _, p in inside):6.1f}" if inside else "     -"
        print(f"{d:>4} {n:>6} {name:>6} {tflops:8.1f} {clock} {power} {len(inside):7}")


def run_window(fn, seconds, flops):
    """Calls fn back to back for `seconds` (8 queued per host sync); returns the window's wall-clock
    start and end and the TFLOP/s of its calls (CUDA events around the whole window)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = datetime.datetime.now()
    start.record()
    calls = 0
    while (datetime.datetime.now() - t0).total_seconds() < seconds:
        for _ in range(8):
            fn()
        calls += 8
        torch.cuda.synchronize()
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end) / calls
    return t0, datetime.datetime.now(), flops / ms / 1e9


if __name__ == "__main__":
    main()
