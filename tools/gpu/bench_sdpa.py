#!/usr/bin/env python3
"""Forward (and, with --backward, backward) speed of flashattn's sm80 kernels beside PyTorch SDPA's
backends, in one process, on the same inputs, timed the same way (CUDA events around each call,
median after warm-up). Backward FLOPs are 2.5x the forward's; SDPA's backward is timed as
torch.autograd.grad of a retained graph, which runs only its backward kernels.

Grid of issues 3's and 4's bars: bf16, 16k total tokens, hidden 2048 (batch = 16384 / n, heads =
2048 / d), n in 2k / 4k / 8k / 16k, d in 64 / 128 / 256, causal and not. FLOPs as the FlashAttention
papers count them: 4 * batch * heads * n * n * d, halved under causal masking. Each input set
(q, k, v, o) is 256 MB, several times the 60 MB L2, so repeated calls do not run from the cache.

    python3 tools/gpu/bench_sdpa.py --lib build/gpu/libflashattn_shim.so [--json out.json]
"""
import argparse
import ctypes
import json
import os
import random
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

DTYPES = {torch.float16: 1, torch.bfloat16: 2}
SM80, SM90 = 4, 5  # flashattn::Backend values of the two forwards


class Ours:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        f = self.lib.flashattn_shim_forward
        i64 = ctypes.c_int64
        f.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] + [i64] * 6 + \
            [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
             ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
        f.restype = ctypes.c_int
        self.msg = ctypes.create_string_buffer(512)
        self.workspace = None
        g = self.lib.flashattn_shim_backward
        g.argtypes = [ctypes.c_void_p] * 10 + [ctypes.POINTER(ctypes.c_size_t), ctypes.c_int] + [i64] * 6 + \
            [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
        g.restype = ctypes.c_int

    def forward_mods(self, q, k, v, o, causal, softcap=0.0, alibi=None, bias=None, mask=None):
        """The forward with score modifiers; bias (q's dtype) and mask (bool) are [b, h, n, n] views
        (zero strides broadcast)."""
        b, n, h, d = q.shape
        f = self.lib.flashattn_shim_forward_mods
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        f.argtypes = [ptr] * 4 + [ctypes.c_int] + [i64] * 4 + [ctypes.c_int, ctypes.c_float, ptr, ptr] + [i64] * 3 + \
            [ptr] + [i64] * 3 + [ctypes.c_char_p, ctypes.c_int]
        f.restype = ctypes.c_int
        bs = bias.stride()[:3] if bias is not None else (0, 0, 0)
        ms = mask.stride()[:3] if mask is not None else (0, 0, 0)
        rc = f(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), DTYPES[q.dtype], b, n, h, d, int(causal),
               softcap, alibi.data_ptr() if alibi is not None else None, bias.data_ptr() if bias is not None else None,
               *bs, mask.data_ptr() if mask is not None else None, *ms, self.msg, 512)
        if rc != 0:
            raise RuntimeError(self.msg.value.decode())

    def backward(self, q, k, v, o, do, lse, dq, dk, dv, causal, workspace=None):
        """With workspace None: returns the bytes of workspace the call needs. Else runs it."""
        b, sq, hq, d = q.shape
        sk, hkv = k.shape[1], k.shape[2]
        nbytes = ctypes.c_size_t(workspace.numel() if workspace is not None else 0)
        rc = self.lib.flashattn_shim_backward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), do.data_ptr(),
                                              lse.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                                              workspace.data_ptr() if workspace is not None else None,
                                              ctypes.byref(nbytes), DTYPES[q.dtype], b, sq, sk, hq, hkv, d,
                                              int(causal), 0, None, self.msg, 512)
        if rc != 0:
            raise RuntimeError(self.msg.value.decode())
        return nbytes.value

    def forward_workspace(self, q, k, v, o, causal, backend=SM90):
        """The bytes of workspace the forward asks for (the sm90 split tail's: 0 where it does not split)."""
        b, sq, hq, d = q.shape
        nbytes = ctypes.c_size_t(0)
        rc = self.lib.flashattn_shim_forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), None,
                                             DTYPES[q.dtype], b, sq, k.shape[1], hq, k.shape[2], d, int(causal), 0,
                                             backend, None, ctypes.byref(nbytes), None, self.msg, 512)
        if rc != 0:
            raise RuntimeError(self.msg.value.decode())
        return nbytes.value

    def __call__(self, q, k, v, o, lse, causal, top_left=False, backend=SM80, split=True, share=True, env=None):
        """The forward, with the workspace it asks for (the sm90 split tail's; asked for at every call,
        kept between calls). split=False: FLASHATTN_SM90_SPLIT=0 around the call, the plain schedule;
        share=False: FLASHATTN_SM90_SHARED_TAILS=0, no shared tails (one consumer computes a one-slice last tile); env: more variables
        set around the call (the library reads its switches at every call)."""
        b, sq, hq, d = q.shape
        sk, hkv = k.shape[1], k.shape[2]
        around = dict(env or {})
        if not split:
            around["FLASHATTN_SM90_SPLIT"] = "0"
        if not share:
            around["FLASHATTN_SM90_SHARED_TAILS"] = "0"
        saved = {name: os.environ.get(name) for name in around}
        os.environ.update(around)
        try:
            args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr() if lse is not None else None,
                    DTYPES[q.dtype], b, sq, sk, hq, hkv, d, int(causal), int(top_left), backend)
            nbytes = ctypes.c_size_t(0)
            rc = self.lib.flashattn_shim_forward(*args, None, ctypes.byref(nbytes), None, self.msg, 512)
            if rc == 0:
                if nbytes.value > 0 and (self.workspace is None or self.workspace.numel() < nbytes.value):
                    self.workspace = torch.empty(nbytes.value, dtype=torch.uint8, device=q.device)
                ws = self.workspace.data_ptr() if nbytes.value > 0 else 1  # not null: run (0 bytes needed)
                rc = self.lib.flashattn_shim_forward(*args, ws, ctypes.byref(nbytes), None, self.msg, 512)
        finally:
            for name, value in saved.items():
                if value is None:
                    del os.environ[name]
                else:
                    os.environ[name] = value
        if rc != 0:
            raise RuntimeError(self.msg.value.decode())


def benchmark_inputs(n, d, dtype=torch.bfloat16):
    """The benchmark's inputs at sequence length n and head dim d (16k tokens, hidden 2048: batch
    16384 / n, at least 1, heads 2048 / d): q, k, v and an output o, [b, n, h, d], and the [b, h, n, d]
    views of q, k and v that SDPA takes."""
    b, h = max(1, 16384 // n), 2048 // d
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=dtype) for _ in range(3))
    return q, k, v, torch.empty_like(q), tuple(x.transpose(1, 2) for x in (q, k, v))


def time_ms(fn, warmup=3, reps=10):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def time_interleaved(fns, warmup=3, rounds=8, reps=4, seed=0):
    """Median ms per call of each of fns (name -> callable), timed in rounds: every round times each
    entry once, in an order drawn afresh each round (a seeded shuffle), so that a clock that drifts
    during the run (the card warming up under a fast kernel, or cooling after a slow one) weighs on
    every entry alike: a rotated order would have each entry always follow the same neighbour (the
    first build listed after cuDNN measured 5-9% above a copy of itself listed later, at n = 16k). A
    sample is the CUDA-event time of `reps` calls queued back to back behind one untimed call,
    divided by reps: the device time of the calls, without the host's launch overhead (which the
    queue hides) or an idle gap before the first."""
    names = list(fns)
    order = random.Random(seed)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    times = {name: [] for name in names}
    for _ in range(rounds):
        for name in order.sample(names, len(names)):
            fn = fns[name]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            fn()
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / reps)
    return {name: statistics.median(t) for name, t in times.items()}


def backward_row(ours, row, q, k, v, o, lse, causal, flops):
    """Times SDPA flash's backward and ours (where our backend takes the shape) on the same dO."""
    do = torch.randn_like(q)
    qg, kg, vg = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
    dot = do.transpose(1, 2)
    grads = lambda: torch.autograd.grad(out, (qg, kg, vg), dot, retain_graph=True)
    dq_flash = grads()[0]
    fns = {"flash": grads}
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    try:
        nbytes = ours.backward(q, k, v, o, do, lse, dq, dk, dv, causal)
        ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device="cuda")
        dq.fill_(float("nan"))
        ours.backward(q, k, v, o, do, lse, dq, dk, dv, causal, ws)
        torch.cuda.synchronize()
        row["bwd_max_abs_diff_dq"] = (dq.transpose(1, 2).float() - dq_flash.float()).abs().max().item()
        fns["ours"] = lambda: ours.backward(q, k, v, o, do, lse, dq, dk, dv, causal, ws)
    except RuntimeError as e:  # a head dim our backward does not take yet is reported, not fatal
        row["ours_bwd_error"] = str(e)[:120]
    for name, ms in time_interleaved(fns).items():
        row[f"{name}_bwd_ms"], row[f"{name}_bwd_tflops"] = ms, flops / ms / 1e9
    del out, qg, kg, vg, dq_flash, dq, dk, dv, do, fns


def options_table(ours, dtype, d=128, n=8192):
    """Forward with each score modifier at one shape (bf16, 16k tokens, hidden 2048), beside our plain
    forward and SDPA's efficient backend with the same float bias / bool mask (flash and cuDNN take
    neither). FLOPs counted as for the plain forward, so the columns compare times."""
    b, h = 16384 // n, 2048 // d
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=dtype) for _ in range(3))
    o = torch.empty_like(q)
    flops = 4 * b * h * n * n * d
    slopes = torch.rand(h, device="cuda", dtype=torch.float32) * 0.1
    bias_full = torch.randn(1, h, n, n, device="cuda", dtype=dtype).expand(b, h, n, n)  # per head, shared by batch
    # Masks as bytes (ours), broadcast by zero strides: key padding keeps 3/4 of the keys; the
    # block-sparse one keeps half of the 128x128 tiles.
    keep = (torch.rand(b, 1, 1, n, device="cuda") > 0.25).to(torch.uint8).expand(b, h, n, n)
    keep_sparse = (torch.rand(1, 1, n // 128, n // 128, device="cuda") > 0.5).to(torch.uint8) \
        .repeat_interleave(128, 2).repeat_interleave(128, 3).expand(b, h, n, n)
    cases = [("plain", {}), ("softcap 30", {"softcap": 30.0}), ("ALiBi", {"alibi": slopes}),
             ("bias [1,h,n,n]", {"bias": bias_full}), ("mask key padding", {"mask": keep}),
             ("mask block-sparse 50%", {"mask": keep_sparse})]
    rows = []
    for name, kw in cases:
        mask = kw.get("mask")
        row = {"case": name}
        fns = {}  # each run once, then timed together (time_interleaved)
        try:
            fn = lambda kw=kw: ours.forward_mods(q, k, v, o, False, **kw)
            fn()
            torch.cuda.synchronize()
            fns["ours"] = fn
        except RuntimeError as e:
            row["ours_error"] = str(e)[:120]
        if "bias" in kw or mask is not None:
            attn = kw["bias"] if "bias" in kw else mask.bool()
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

            def efficient(attn=attn):
                with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                    return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=attn)
            try:
                efficient()
                torch.cuda.synchronize()
                fns["efficient"] = efficient
            except Exception as e:
                row["efficient_error"] = str(e).splitlines()[0][:120]
        for entry, ms in time_interleaved(fns).items():
            row[f"{entry}_tflops"] = flops / ms / 1e9
        rows.append(row)
        print(json.dumps(row), flush=True)
    # Sparse masks skip tiles, so a rate above the plain one is expected there.
    print()
    print(f"forward with score modifiers, TFLOP/s as if dense (d={d}, n={n}, batch {b}, heads {h}, non-causal)")
    print(f"{'case':>22} {'ours':>7} {'efficient':>9}")
    for r in rows:
        o_t = f"{r['ours_tflops']:7.1f}" if "ours_tflops" in r else f"{'-':>7}"
        e_t = f"{r['efficient_tflops']:9.1f}" if "efficient_tflops" in r else f"{'-':>9}"
        print(f"{r['case']:>22} {o_t} {e_t}")
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--json")
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqlens", default="2048,4096,8192,16384")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--backends", default="flash,cudnn,efficient,math")
    ap.add_argument("--math-max-n", type=int, default=2048, help="math backend only up to this n (memory, time)")
    ap.add_argument("--backward", action="store_true", help="also time the backward (ours where supported, SDPA flash)")
    ap.add_argument("--options", action="store_true", help="also time the forward with each score modifier (d 128, n 8k)")
    ap.add_argument("--rounds", type=int, default=8, help="samples per entry of the forward table (time_interleaved); "
                    "30 brought identical columns within 2%% of each other (8: 2-5%%)")
    args = ap.parse_args()

    ours = Ours(args.lib)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    names = [b for b in args.backends.split(",") if b]
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  dtype {args.dtype}", flush=True)
    rows = []
    for d in [int(x) for x in args.dims.split(",")]:
        for n in [int(x) for x in args.seqlens.split(",")]:
            for causal in (False, True):
                b, h = 16384 // n, 2048 // d
                torch.manual_seed(0)
                q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=dtype) for _ in range(3))
                o = torch.empty_like(q)
                lse = torch.empty(b, h, n, device="cuda", dtype=torch.float32)
                flops = 4 * b * h * n * n * d * (0.5 if causal else 1.0)
                row = {"d": d, "n": n, "batch": b, "heads": h, "causal": causal}
                # Each entry is run once and checked, then all are timed together (time_interleaved).
                o.fill_(float("nan"))
                ours(q, k, v, o, lse, causal)
                torch.cuda.synchronize()
                fns = {"ours": lambda: ours(q, k, v, o, lse, causal)}
                # The Hopper forward on the same inputs (refused off sm_90 or for shapes it does not take).
                o90, lse90 = torch.full_like(q, float("nan")), torch.empty_like(lse)
                try:
                    ours(q, k, v, o90, lse90, causal, backend=SM90)
                    torch.cuda.synchronize()
                    fns["sm90"] = lambda: ours(q, k, v, o90, lse90, causal, backend=SM90)
                    row["max_abs_diff_sm90_vs_sm80"] = (o90.float() - o.float()).abs().max().item()
                except RuntimeError as e:
                    row["sm90_error"] = str(e)[:120]
                # SDPA takes [b, h, n, d]: views of the same [b, n, h, d] storage. Its causal is top-left,
                # the same as ours for n_q == n_k. The math backend (slow) is timed on its own.
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                for name in names:
                    if name == "math" and n > args.math_max_n:
                        continue
                    try:
                        def fn(backend=backends[name]):
                            with sdpa_kernel(backend):
                                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                        ref = fn()
                        torch.cuda.synchronize()
                        if name == "math":
                            ms = time_ms(fn, warmup=2, reps=5)
                            row["math_ms"], row["math_tflops"] = ms, flops / ms / 1e9
                        else:
                            fns[name] = fn
                        if name == "flash":
                            row["max_abs_diff_vs_flash"] = (o.transpose(1, 2).float() - ref.float()).abs().max().item()
                        del ref
                    except Exception as e:  # a backend that does not take the shape is reported, not fatal
                        row[f"{name}_error"] = str(e).splitlines()[0][:120]
                for name, ms in time_interleaved(fns, rounds=args.rounds).items():
                    row[f"{name}_ms"], row[f"{name}_tflops"] = ms, flops / ms / 1e9
                del o90, lse90, fns
                if args.backward:
                    backward_row(ours, row, q, k, v, o, lse, causal, flops * 2.5)
                rows.append(row)
                print(json.dumps(row), flush=True)
                del q, k, v, o, lse, qt, kt, vt
                torch.cuda.empty_cache()

    options = options_table(ours, dtype) if args.options else None
    if args.backward:
        print()
        print("backward TFLOP/s (2.5x forward FLOPs), " + args.dtype + ", 16k tokens, hidden 2048")
        print(f"{'d':>4} {'n':>6} {'causal':>6} {'ours':>7} {'flash':>7} {'ours/flash':>10} {'max |dq-dq_flash|':>18}")
        for r in rows:
            ours_t = f"{r['ours_bwd_tflops']:7.1f}" if "ours_bwd_tflops" in r else f"{'-':>7}"
            flash_t = f"{r['flash_bwd_tflops']:7.1f}" if "flash_bwd_tflops" in r else f"{'-':>7}"
            ratio = r["ours_bwd_tflops"] / r["flash_bwd_tflops"] if "ours_bwd_tflops" in r and "flash_bwd_tflops" in r \
                else float("nan")
            print(f"{r['d']:>4} {r['n']:>6} {str(r['causal']):>6} {ours_t} {flash_t} {ratio:10.2f} "
                  f"{r.get('bwd_max_abs_diff_dq', float('nan')):18.1e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"grid": rows, "options": options} if options is not None else rows, f, indent=1)
    # The short table, last.
    print()
    # ours = the sm80 forward, sm90 = the Hopper forward (cuda-sm90; '-' where it refused the shape).
    header = f"{'d':>4} {'n':>6} {'causal':>6} {'ours':>7} {'sm90':>7}" + "".join(f" {x:>9}" for x in names) + \
        f" {'ours/flash':>10} {'sm90/cudnn':>10} {'sm90/flash':>10} {'maxdiff':>8} {'sm90diff':>8}"
    print("forward TFLOP/s, " + args.dtype + ", 16k tokens, hidden 2048 (ours: sm80; sm90: the Hopper forward)")
    print(header)
    nan = float("nan")
    for r in rows:
        cells = "".join(f" {r[x + '_tflops']:9.1f}" if x + "_tflops" in r else f" {'-':>9}" for x in names)
        sm90 = f"{r['sm90_tflops']:7.1f}" if "sm90_tflops" in r else f"{'-':>7}"
        ratio = r["ours_tflops"] / r["flash_tflops"] if "flash_tflops" in r else nan
        sm90_cudnn = r["sm90_tflops"] / r["cudnn_tflops"] if "sm90_tflops" in r and "cudnn_tflops" in r else nan
        sm90_flash = r["sm90_tflops"] / r["flash_tflops"] if "sm90_tflops" in r and "flash_tflops" in r else nan
        print(f"{r['d']:>4} {r['n']:>6} {str(r['causal']):>6} {r['ours_tflops']:7.1f} {sm90}{cells} {ratio:10.2f} "
              f"{sm90_cudnn:10.2f} {sm90_flash:10.2f} {r.get('max_abs_diff_vs_flash', nan):8.1e} "
              f"{r.get('max_abs_diff_sm90_vs_sm80', nan):8.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
