#!/usr/bin/env python3
"""The sm80 backward (or, with --forward sm80|sm90, one forward path) of several builds of the GPU
shim (kernel variants, policies) timed side by side with SDPA's flash backward (forward: flash and
cuDNN), on the same inputs, in one process: the A/B harness behind the entries of docs/perf.md.
Timing as bench_sdpa.py (time_interleaved: CUDA events, median of rounds in shuffled order, after
warm-up); each build's dQ (forward: O) is checked against flash's.

    python3 tools/gpu/compare_backward.py --lib v0=build/a/libflashattn_shim.so --lib v1=build/b/...
A path followed by :nosplit runs that build's forward without the sm90 split tail (FLASHATTN_SM90_SPLIT=0
around its calls), so one build can be timed with and without it; :noshare likewise without shared
tails (FLASHATTN_SM90_SHARED_TAILS=0); :NAME=VALUE sets any variable around its calls, e.g.
:FLASHATTN_SM90_SHARED_TAIL_CREDIT=30. Several may follow one path.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sdpa import SM80, SM90, Ours, time_interleaved  # noqa: E402


def forward_line(args, libs, q, k, v, causal, flops):
    """One row of the forward comparison: SDPA flash and cuDNN, then each build's forward path."""
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

    def sdpa(backend):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    o_ref = sdpa(SDPBackend.FLASH_ATTENTION).transpose(1, 2)
    fns = {"flash": lambda: sdpa(SDPBackend.FLASH_ATTENTION), "cudnn": lambda: sdpa(SDPBackend.CUDNN_ATTENTION)}
    backend = SM90 if args.forward == "sm90" else SM80
    outs, errs = [], []
    for i, (_, lib, opts) in enumerate(libs):
        o = torch.full_like(q, float("nan"))
        lib(q, k, v, o, None, causal, backend=backend, **opts)
        torch.cuda.synchronize()
        errs.append((o.float() - o_ref.float()).abs().max().item())
        outs.append(o)
        fns[i] = lambda lib=lib, o=o, opts=opts: lib(q, k, v, o, None, causal, backend=backend, **opts)
    times = time_interleaved(fns, rounds=args.rounds, reps=args.reps)
    tflops = {name: flops / ms / 1e9 for name, ms in times.items()}
    b, n, h, d = q.shape
    return f"{d:>4} {n:>6} {str(causal):>6} {tflops['flash']:7.1f} {tflops['cudnn']:7.1f}" + "".join(
        f" {tflops[i]:7.1f} {tflops[i] / tflops['flash']:5.2f} {tflops[i] / tflops['cudnn']:5.2f}"
        f"{'' if errs[i] < 0.05 else ' BAD'}" for i in range(len(libs)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", action="append", required=True, help="name=path of a libflashattn_shim.so")
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqlens", default="2048,4096,8192,16384")
    ap.add_argument("--reps", type=int, default=4, help="calls per timed sample (time_interleaved)")
    ap.add_argument("--rounds", type=int, default=8, help="samples per entry, each round in a fresh order "
                    "(time_interleaved); more rounds narrow the spread between identical columns")
    ap.add_argument("--forward", choices=["sm80", "sm90"], help="time this forward path instead of the backward")
    ap.add_argument("--causal", choices=["both", "no", "yes"], default="both")
    args = ap.parse_args()
    loaded = {}

    def lib_of(spec):
        name, path = spec.split("=", 1)
        path, *mods = path.split(":")
        opts = {}
        for mod in mods:
            if mod in ("noshare", "nosplit"):
                opts[mod.removeprefix("no")] = False
            elif "=" in mod:
                key, value = mod.split("=", 1)
                opts.setdefault("env", {})[key] = value
            else:
                raise SystemExit(f"--lib {spec}: unknown option :{mod} (noshare, nosplit or NAME=VALUE)")
        loaded.setdefault(path, Ours(path))
        return name, loaded[path], opts

    libs = [lib_of(x) for x in args.lib]
    dtype = torch.bfloat16
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  bf16, 16k tokens, hidden 2048", flush=True)
    lines = []
    for d in [int(x) for x in args.dims.split(",")]:
        for n in [int(x) for x in args.seqlens.split(",")]:
            for causal in {"both": (False, True), "no": (False,), "yes": (True,)}[args.causal]:
                b, h = 16384 // n, 2048 // d
                torch.manual_seed(0)
                q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=dtype) for _ in range(4))
                flops = (1.0 if args.forward else 2.5) * 4 * b * h * n * n * d * (0.5 if causal else 1.0)
                if args.forward:
                    lines.append(forward_line(args, libs, q, k, v, causal, flops))
                    print(lines[-1], flush=True)
                    del q, k, v, do
                    torch.cuda.empty_cache()
                    continue
                qg, kg, vg = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                grads = lambda: torch.autograd.grad(out, (qg, kg, vg), do.transpose(1, 2), retain_graph=True)
                dq_flash = grads()[0].transpose(1, 2)
                o = torch.empty_like(q)
                lse = torch.empty(b, h, n, device="cuda", dtype=torch.float32)
                libs[0][1](q, k, v, o, lse, causal)  # the sm80 forward's O and lse, shared by every build
                fns, errs, keep = {"flash": grads}, [], []
                for i, (_, lib, _) in enumerate(libs):
                    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                    ws = torch.empty(max(lib.backward(q, k, v, o, do, lse, dq, dk, dv, causal), 1), dtype=torch.uint8,
                                     device="cuda")
                    dq.fill_(float("nan"))
                    lib.backward(q, k, v, o, do, lse, dq, dk, dv, causal, ws)
                    torch.cuda.synchronize()
                    errs.append((dq.float() - dq_flash.float()).abs().max().item())
                    keep.append((dq, dk, dv, ws))
                    fns[i] = lambda lib=lib, g=keep[-1]: lib.backward(q, k, v, o, do, lse, *g[:3], causal, g[3])
                times = time_interleaved(fns, rounds=args.rounds, reps=args.reps)
                tflops = {name: flops / ms / 1e9 for name, ms in times.items()}
                flash = tflops["flash"]
                cells = [(tflops[i], errs[i]) for i in range(len(libs))]
                del keep, fns
                line = f"{d:>4} {n:>6} {str(causal):>6} {flash:7.1f}" + "".join(
                    f" {t:7.1f} {t / flash:5.2f}{'' if err < 0.05 else ' BAD'}" for t, err in cells)
                print(line, flush=True)
                lines.append(line)
                del q, k, v, do, qg, kg, vg, out, dq_flash, o, lse
                torch.cuda.empty_cache()
    print()
    if args.forward:
        print(f"{args.forward} forward TFLOP/s and ratio to flash and cuDNN, bf16, 16k tokens, hidden 2048")
        print(f"{'d':>4} {'n':>6} {'causal':>6} {'flash':>7} {'cudnn':>7}" +
              "".join(f" {name:>7} {'/fl':>5} {'/cud':>5}" for name, _, _ in libs))
    else:
        print("backward TFLOP/s (2.5x forward FLOPs) and ratio to flash, bf16, 16k tokens, hidden 2048")
        print(f"{'d':>4} {'n':>6} {'causal':>6} {'flash':>7}" + "".join(f" {name:>7} {'/fl':>5}" for name, _, _ in libs))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
