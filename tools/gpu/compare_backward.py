#!/usr/bin/env python3
"""The sm80 backward of several builds of the GPU shim (kernel variants, policies) timed side by side
with SDPA's flash backward, on the same inputs, in one process: the A/B harness behind the backward
entries of docs/perf.md. Timing as bench_sdpa.py (CUDA events, median after warm-up); each build's dQ
is checked against flash's.

    python3 tools/gpu/compare_backward.py --lib v0=build/a/libflashattn_shim.so --lib v1=build/b/...
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sdpa import Ours, time_ms  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", action="append", required=True, help="name=path of a libflashattn_shim.so")
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqlens", default="2048,8192,16384")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    libs = [(x.split("=", 1)[0], Ours(x.split("=", 1)[1])) for x in args.lib]
    dtype = torch.bfloat16
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  bf16, 16k tokens, hidden 2048", flush=True)
    lines = []
    for d in [int(x) for x in args.dims.split(",")]:
        for n in [int(x) for x in args.seqlens.split(",")]:
            for causal in (False, True):
                b, h = 16384 // n, 2048 // d
                torch.manual_seed(0)
                q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=dtype) for _ in range(4))
                flops = 2.5 * 4 * b * h * n * n * d * (0.5 if causal else 1.0)
                qg, kg, vg = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                grads = lambda: torch.autograd.grad(out, (qg, kg, vg), do.transpose(1, 2), retain_graph=True)
                dq_flash = grads()[0].transpose(1, 2)
                flash = flops / time_ms(grads, reps=args.reps) / 1e9
                o = torch.empty_like(q)
                lse = torch.empty(b, h, n, device="cuda", dtype=torch.float32)
                libs[0][1](q, k, v, o, lse, causal)  # the sm80 forward's O and lse, shared by every build
                cells = []
                for name, lib in libs:
                    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                    ws = torch.empty(max(lib.backward(q, k, v, o, do, lse, dq, dk, dv, causal), 1), dtype=torch.uint8,
                                     device="cuda")
                    dq.fill_(float("nan"))
                    lib.backward(q, k, v, o, do, lse, dq, dk, dv, causal, ws)
                    torch.cuda.synchronize()
                    err = (dq.float() - dq_flash.float()).abs().max().item()
                    t = flops / time_ms(lambda: lib.backward(q, k, v, o, do, lse, dq, dk, dv, causal, ws),
                                        reps=args.reps) / 1e9
                    cells.append((t, err))
                    del dq, dk, dv, ws
                line = f"{d:>4} {n:>6} {str(causal):>6} {flash:7.1f}" + "".join(
                    f" {t:7.1f} {t / flash:5.2f}{'' if err < 0.05 else ' BAD'}" for t, err in cells)
                print(line, flush=True)
                lines.append(line)
                del q, k, v, do, qg, kg, vg, out, dq_flash, o, lse
                torch.cuda.empty_cache()
    print()
    print("backward TFLOP/s (2.5x forward FLOPs) and ratio to flash, bf16, 16k tokens, hidden 2048")
    print(f"{'d':>4} {'n':>6} {'causal':>6} {'flash':>7}" + "".join(f" {name:>7} {'/fl':>5}" for name, _ in libs))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
