#!/usr/bin/env python3
"""What a query tile with rows for fewer consumers costs against a whole one (the sm90 forward's last
query tile of each head, 4096 = 21 x 192 + 64; docs/perf.md, "lone tails"). For each head dim, key
count and rows per tile (64, 128 and Br = 192: one, two and three of the three consumers' slices:
the policies of d = 64 and of d = 128 without a band, policy.hpp; no other head dim), the forward
of one query tile per (batch, head) is timed on one and on two full waves of the persistent grid
(G and 2 G items, G = the SMs: no split tail, no partial wave); the slope is one item's time,
without the launch. Prints each slope and its ratio to the whole tile's: 1 - ratio is the credit.

    python3 tools/gpu/tail_cost.py --lib build/ab/tree/tools/gpu/libflashattn_shim.so
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sdpa import SM90, Ours, time_interleaved  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--dims", default="128,64")
    ap.add_argument("--keys", default="4096,16384")
    args = ap.parse_args()
    dims = [int(x) for x in args.dims.split(",")]
    if any(d not in (64, 128) for d in dims):
        sys.exit(f"--dims {args.dims}: takes 64 and 128 (the policies of 192-row tiles in three slices)")
    lib = Ours(args.lib)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"device: {torch.cuda.get_device_name()}, {sms} SMs; bf16; one query tile per (batch, head)")
    print(f"{'d':>4} {'keys':>6} {'rows':>5} {'1 wave us':>10} {'2 waves us':>11} {'item us':>8} {'/whole':>7}")
    for d in dims:
        for sk in (int(x) for x in args.keys.split(",")):
            fns, shapes = {}, {}
            for rows in (64, 128, 192):
                for waves in (1, 2):
                    q = torch.randn(1, rows, waves * sms, d, device="cuda", dtype=torch.bfloat16)
                    k, v = (torch.randn(1, sk, waves * sms, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
                    o = torch.empty_like(q)
                    shapes[(rows, waves)] = (q, k, v, o)
                    fns[(rows, waves)] = lambda t=shapes[(rows, waves)]: lib(*t, None, False, backend=SM90)
            ms = time_interleaved(fns, rounds=12, reps=8)
            item = {rows: 1e3 * (ms[(rows, 2)] - ms[(rows, 1)]) for rows in (64, 128, 192)}
            for rows in (64, 128, 192):
                print(f"{d:>4} {sk:>6} {rows:>5} {1e3 * ms[(rows, 1)]:10.1f} {1e3 * ms[(rows, 2)]:11.1f} "
                      f"{item[rows]:8.1f} {item[rows] / item[192]:7.3f}", flush=True)
            del fns, shapes
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
