#!/usr/bin/env bash
# Measures the CPU bars of the core library in one run with flashattn-bench (b1, h8, n4096, d128,
# 2 threads unless THREADS is set) and prints a short table last. JSON of each run goes to
# bench-out/bars-*.json. Run on a quiet machine: other load moves every number.
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench-out
mkdir -p "$out"
threads=${THREADS:-2}
bench() { bash scripts/bench.sh --threads "$threads" --json "$@"; }
bench --repeats 7 > "$out/bars-fp32.json"
bench --repeats 7 --causal --no-standard > "$out/bars-causal.json"
bench --repeats 7 --dtype bf16 --no-standard > "$out/bars-bf16.json"
bench --repeats 5 --backward --no-standard > "$out/bars-backward.json"
bench --repeats 3 --seqlen 16384 --max-standard-bytes 0 > "$out/bars-16k.json"
python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
r = {k: json.load(open(f"{d}/bars-{k}.json")) for k in ["fp32", "causal", "bf16", "backward", "16k"]}
f = r["fp32"]
gemm = f["gemm_gflops"]
rows = [
  ("fp32 fwd GFLOP/s vs sgemm", f["flash_gflops"], f"{f['flash_gflops'] / gemm:.2f}x sgemm ({gemm:.0f})", ">= 0.70x"),
  ("fp32 fwd vs standard", f["standard_gflops"], f"{f['flash_gflops'] / f['standard_gflops']:.2f}x standard", ">= 1.0x"),
  ("causal fwd speed-up", r["causal"]["flash_ms"], f"{f['flash_ms'] / r['causal']['flash_ms']:.2f}x faster", ">= 1.8x"),
  ("bf16 fwd GFLOP/s", r["bf16"]["flash_gflops"], f"{r['bf16']['flash_gflops'] / f['flash_gflops']:.2f}x fp32", ">= 1.3x"),
  ("fp32 bwd GFLOP/s (2.5x fwd FLOPs)", r["backward"]["flash_bwd_gflops"],
   f"{r['backward']['flash_bwd_gflops'] / r['backward']['gemm_gflops']:.2f}x sgemm ({r['backward']['gemm_gflops']:.0f})", ">= 0.45x"),
  ("n=16384 flash extra MiB", r["16k"]["flash_extra_bytes"] / 2**20,
   f"standard needs {r['16k']['standard_extra_bytes'] / 2**30:.1f} GiB", "< 64 MiB"),
]
errs = {k: v.get("max_abs_err") for k, v in r.items()}
print()
print(f"{'bar':36} {'value':>10}  {'ratio':28} {'needed'}")
for name, v, ratio, need in rows:
  print(f"{name:36} {v:10.1f}  {ratio:28} {need}")
print("max |err| vs fp64 reference:", ", ".join(f"{k} {v:.1e}" for k, v in errs.items() if v is not None))
PY
