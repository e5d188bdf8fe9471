#!/usr/bin/env python3
"""Where one kernel launch spends more than another, per source line: instructions executed and
warp-state samples from two Nsight Compute source-page exports of the same kernel binary (for
instance d = 128 at n = 4k and at 16k, which run the same 2048 items with 32 and 128 key tiles
each), the second divided by --scale (4 there: what a line costs per key tile then cancels, and
what it costs per item, per call or per wait remains). SASS addresses are mapped to source lines
with the line table of a cubin built with -lineinfo (nvdisasm -g), so the GPU run needs no
source-level export.

On the GPU (a -lineinfo build of the shim; one export per shape):

    ncu --profile-from-start off --clock-control base -k regex:forward_kernel \\
        --section SourceCounters --section WarpStateStats -o src_4096 \\
        python3 tools/gpu/profile_forward.py --lib build/gpu/tools/gpu/libflashattn_shim.so --seqlen 4096
    ncu -i src_4096.ncu-rep --page source --csv --print-source sass > sass_4096.csv

Here (the same compiler and flags as that build, so that the SASS is the same; checked below):

    nvcc -Iinclude -Isrc -O3 -DNDEBUG -lineinfo -gencode=arch=compute_90a,code=sm_90a \\
        --expt-relaxed-constexpr -std=c++17 -cubin -x cu src/cuda/sm90/instantiations/forward_hdim128_bf16.cu -o f.cubin
    python3 tools/gpu/source_lines.py --cubin f.cubin --kernel Lb0E sass_4096.csv sass_16384.csv --scale 4

Written in session 20 (docs/perf.md, "An item's fixed cost, found per source line").
"""
import argparse
import collections
import csv
import gzip
import re
import shutil
import subprocess
import sys


def line_table(cubin, kernel, nvdisasm):
    """{offset: (file:line, opcode)} of the first function whose name contains `kernel`."""
    text = subprocess.run([nvdisasm, "-g", "-c", cubin], check=True, capture_output=True, text=True).stdout
    table, inside, where = {}, False, None
    for line in text.splitlines():
        if line.startswith(".text."):
            if inside:
                break
            inside = kernel in line
            continue
        if not inside:
            continue
        m = re.match(r'\s*//## File "([^"]+)", line (\d+)', line)
        if m:
            where = "/".join(m.group(1).split("/")[-2:]) + ":" + m.group(2)
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            table[int(m.group(1), 16)] = (where, m.group(2).split(".")[0])
    if not table:
        sys.exit(f"no function matching {kernel!r} in {cubin}")
    return table


def read_export(path):
    """[(offset, opcode, samples, instructions)] of an ncu source-page CSV (sass view)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    header_at = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    header = {name: i for i, name in enumerate(rows[header_at])}
    body = rows[header_at + 1:]
    base = int(body[0][0], 16)
    samples_col, inst_col = header["Warp Stall Sampling (All Samples)"], header["Instructions Executed"]
    out = []
    for r in body:
        opcode = re.sub(r"^@!?U?P\w+\s+", "", r[1].strip()).split(" ")[0].split(".")[0]
        out.append((int(r[0], 16) - base, opcode, int(r[samples_col] or 0), int(r[inst_col] or 0)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a", help="source-page CSV (.csv or .csv.gz) of the launch looked at")
    ap.add_argument("b", help="the same of the launch it is compared with")
    ap.add_argument("--scale", type=float, default=1.0, help="b's counts are divided by this")
    ap.add_argument("--cubin", required=True, help="a -lineinfo cubin of the same kernel binary")
    ap.add_argument("--kernel", default="forward_kernel", help="substring of the function's mangled name")
    ap.add_argument("--items", type=int, default=0, help="divide the excess by this (per-item figures)")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--nvdisasm", default=shutil.which("nvdisasm") or "nvdisasm")
    args = ap.parse_args()
    table = line_table(args.cubin, args.kernel, args.nvdisasm)
    a, b = read_export(args.a), read_export(args.b)
    if len(a) != len(b) or any(x[0] != y[0] or x[1] != y[1] for x, y in zip(a, b)):
        sys.exit("the two exports are not of the same SASS")
    unmatched = sum(1 for off, op, _, _ in a if off not in table or table[off][1] != op)
    if unmatched:
        sys.exit(f"{unmatched} of {len(a)} instructions differ from the cubin's: not the same binary")
    lines = collections.defaultdict(lambda: [0, 0.0, 0, 0.0])  # inst a, inst b / scale, samples a, samples b / scale
    for (off, _, sa, ia), (_, _, sb, ib) in zip(a, b):
        g = lines[table[off][0]]
        g[0] += ia
        g[1] += ib / args.scale
        g[2] += sa
        g[3] += sb / args.scale
    per = args.items or 1
    tot = [sum(g[i] for g in lines.values()) for i in range(4)]
    print(f"instructions: a {tot[0]:.0f}, b/scale {tot[1]:.0f} ({(tot[0] / tot[1] - 1) * 100:+.1f}%); "
          f"samples: a {tot[2]:.0f}, b/scale {tot[3]:.0f} ({(tot[2] / tot[3] - 1) * 100:+.1f}%)")
    unit = " per item" if args.items else ""
    print(f"\nlines by excess samples (a - b/scale){unit}")
    print(f"{'line':44} {'x-inst':>10} {'x-samples':>10} {'samples a':>10}")
    ranked = sorted(lines.items(), key=lambda kv: -(kv[1][2] - kv[1][3]))
    for where, g in ranked[:args.top]:
        print(f"{where:44} {(g[0] - g[1]) / per:10.1f} {(g[2] - g[3]) / per:10.2f} {g[2]:10}")
    files = collections.defaultdict(lambda: [0.0, 0.0])
    for where, g in lines.items():
        f = files[where.rsplit(":", 1)[0]]
        f[0] += g[0] - g[1]
        f[1] += g[2] - g[3]
    print(f"\nfiles by excess samples{unit}")
    for name, (xi, xs) in sorted(files.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:44} {xi / per:10.1f} {xs / per:10.2f}")


if __name__ == "__main__":
    main()
