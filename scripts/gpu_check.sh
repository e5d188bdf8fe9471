#!/usr/bin/env bash
# The GPU check, in one call on a GPU machine (an H200 here): configure and build the CUDA backends
# for sm_80 and sm_90a (ptxas report: registers, spills), run the GPU tests (the sm80 kernels, the
# CPU-vs-GPU comparison, the Hopper primitives), compute-sanitizer memcheck and racecheck on small
# cases, the SASS instruction mix, the tensor cores' rate per wgmma shape (flashattn_wgmma_rate) and
# a softmax tile's exponentials per warp (flashattn_mufu_rate),
# flashattn-bench --device cuda, the sm90 forward's timeline within a block (a build with
# FLASHATTN_SM90_TIMELINE, d = 128 only: tools/gpu/timeline.py), then the forward and backward
# benchmark beside PyTorch SDPA's backends, whose short table is printed last.
#
#   scripts/gpu_check.sh                      everything
#   STEPS="build test" scripts/gpu_check.sh   some steps (build test sanitize sass rate gpubench split timeline
#                                             bench)
#   BENCH_ARGS="--dims 128 --seqlens 8192"    passed to tools/gpu/bench_sdpa.py (default --backward --options)
#   TIMELINE_DIMS="128;256"                   the timeline step's head dims (default 128)
#   GPU_BUILD=build/ab-tests STEPS=sanitize   the steps on a build made elsewhere (scripts/gpu_ab.sh's
#                                             tests; the racecheck probe built there too)
# Logs go to $OUT (or build/gpu-check) and the build to build/gpu (or GPU_BUILD).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-"build test sanitize sass rate gpubench split timeline bench"}
LOGS=${OUT:-build/gpu-check}
BUILD=${GPU_BUILD:-build/gpu}  # GPU_BUILD: a build of these targets made elsewhere (scripts/gpu_ab.sh's build/ab-tests)
mkdir -p "$LOGS"
has() { [[ " $STEPS " == *" $1 "* ]]; }
failures=()  # the sanitizers' verdicts: the steps after them still run, and the script fails at the end
fail() { failures+=("$1"); }
step() { echo; echo "==== $* ($(date -u +%H:%M:%S))"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader || true

if has build; then
  step "build (sm_80 + sm_90a)"
  t0=$(date +%s)
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_CUDA_PTXAS_VERBOSE=ON \
        ${CMAKE_ARGS:-} > "$LOGS/configure.log"
  cmake --build "$BUILD" -j "$(nproc)" --target flashattn_cuda_tests flashattn_shim flashattn_tests flashattn-bench \
        flashattn_bench_tests flashattn_sm90_primitive_tests flashattn_wgmma_rate flashattn_mufu_rate \
        flashattn_racecheck_probe \
        > "$LOGS/build.log" 2>&1 || { tail -50 "$LOGS/build.log"; exit 1; }
  echo "[time] build: $(( $(date +%s) - t0 )) s"
  # ptxas: a "Compiling entry function" line per kernel and target, then its usage lines.
  python3 - "$LOGS/build.log" <<'PY'
import collections, re, sys
regs, cur = collections.defaultdict(dict), None
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"Compiling entry function '(\S+)' for '(sm_\w+)'", line)
    if m:
        k = re.search(r"4sm80\d+forward_kernelILi(\d+)ELi(\d+)E(\w+?)Lb([01])E", m.group(1))
        cur = None
        if k:
            dtype = "bf16" if "bfloat16" in k.group(3) else "fp16"
            cur = (f"d{k.group(1)}/dv{k.group(2)} {dtype}", f"{'mods' if k.group(4) == '1' else 'plain'} {m.group(2)}")
        continue
    u = re.search(r"Used (\d+) registers", line)
    if u and cur:
        regs[cur[0]][cur[1]] = u.group(1)
cols = ["plain sm_80", "plain sm_90a", "mods sm_80", "mods sm_90a"]
print(f"  registers per thread    {'  '.join(f'{c:>12}' for c in cols)}")
for key in sorted(regs, key=lambda s: [int(x) for x in re.findall(r"\d+", s)] + [s]):
    cells = "  ".join(f"{regs[key].get(c, '-'):>12}" for c in cols)
    print(f"  {key:22}  {cells}")
PY
  if grep -E "[1-9][0-9]* bytes spill" "$LOGS/build.log"; then echo "SPILLS in the ptxas report"; exit 1; fi
  # ptxas reports wgmma serialisation (C7513) as info, not a warning: it would stall the tensor cores.
  if grep "Performance Loss" "$LOGS/build.log"; then echo "WGMMA SERIALISED in the ptxas report"; exit 1; fi
fi

if has test; then
  step "GPU tests"
  "$BUILD/tests/cuda/flashattn_cuda_tests" --gtest_brief=1 2>&1 | tee "$LOGS/tests.log" | grep -v "^  \|^\[seed\]" || true
  grep -q "PASSED" "$LOGS/tests.log" && ! grep -q "FAILED" "$LOGS/tests.log" || { echo "GPU TESTS FAILED"; exit 1; }
  step "Hopper primitive tests (TMA, mbarrier pipeline, wgmma)"
  timeout 300 "$BUILD/tests/cuda/sm90/flashattn_sm90_primitive_tests" --gtest_brief=1 2>&1 | tee "$LOGS/sm90_tests.log" \
      | grep -v "^  \|^\[seed\]" || true
  grep -q "PASSED" "$LOGS/sm90_tests.log" && ! grep -q "FAILED" "$LOGS/sm90_tests.log" || { echo "SM90 TESTS FAILED"; exit 1; }
  echo "HGMMA in the sm90 tests: $(cuobjdump -sass "$BUILD/tests/cuda/sm90/flashattn_sm90_primitive_tests" | grep -c HGMMA)"
  "$BUILD/tools/bench/flashattn_bench_tests" --gtest_brief=1 > "$LOGS/bench_tests.log" 2>&1 && tail -1 "$LOGS/bench_tests.log" \
      || { tail -30 "$LOGS/bench_tests.log"; echo "BENCH TESTS FAILED"; exit 1; }
  step "CPU tests (same build)"
  "$BUILD/tests/flashattn_tests" --gtest_brief=1 > "$LOGS/cpu_tests.log" 2>&1 && tail -3 "$LOGS/cpu_tests.log" \
      || { tail -40 "$LOGS/cpu_tests.log"; echo "CPU TESTS FAILED"; exit 1; }
fi

if has sanitize; then
  step "compute-sanitizer memcheck (small cases)"
  compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/tests/cuda/flashattn_cuda_tests" --gtest_brief=1 \
      --gtest_filter='*Small*:Sm90ForwardSplit.Deterministic*:*Sm90ForwardSplit*k129*:*Sm90ForwardSharedTails*q203*:*Sm90ForwardSharedTails*q193*' > "$LOGS/memcheck.log" 2>&1 && echo "memcheck: clean" || { tail -30 "$LOGS/memcheck.log"; fail memcheck; }
  step "compute-sanitizer racecheck (a few small cases; shared tails off at run time)"
  FLASHATTN_SM90_SHARED_TAILS=0 compute-sanitizer --tool racecheck --error-exitcode 9 "$BUILD/tests/cuda/flashattn_cuda_tests" --gtest_brief=1 \
      --gtest_filter='*Small*q203_k113*:*Small*varlen*:*SmallRepeat*:Sm80BackwardSmall.VarlenWithEmptySequences:Sm80BackwardSmall.GqaMqa:Sm80BackwardSmall.DeterministicRunsAreBitIdentical:Sm80BackwardSmall.AllModsGqaVarlen:Sm90Pipeline.*:*Sm90ForwardSmall*d128*:*Sm90ForwardVarlen*:*Sm90ForwardPackGqa*d128*' > "$LOGS/racecheck.log" 2>&1 \
      && echo "racecheck: clean" || { grep -E "Race reported|SUMMARY" "$LOGS/racecheck.log" | cut -c1-220 | tail -30; fail racecheck; }
  # Shared tails on: racecheck reports their merge's hand-over (a shared store before a meet of the
  # three consumers, the load after it) though the barrier orders it; racecheck_sites.py fails on any
  # other hazard. The probe (tools/gpu/racecheck_probe.cu) is the same pattern alone: racecheck's count
  # for each way of meeting, reported, not judged (its own check of the merged values is).
  step "compute-sanitizer racecheck, shared tails on (hazards only across the merge's meets)"
  compute-sanitizer --tool racecheck "$BUILD/tests/cuda/flashattn_cuda_tests" --gtest_brief=1 \
      --gtest_filter='*Sm90ForwardSharedTails*q193*:*Sm90ForwardSharedTails*q256*:*Sm90ForwardSmall*q203_k203*d128*' \
      > "$LOGS/racecheck_shared.log" 2>&1 || { tail -30 "$LOGS/racecheck_shared.log"; fail "racecheck (shared tails): tests"; }
  python3 tools/gpu/racecheck_sites.py "$LOGS/racecheck_shared.log" "$BUILD/tests/cuda/flashattn_cuda_tests" \
      || fail "racecheck (shared tails): sites"
  for mode in one three pairs ring all; do
    compute-sanitizer --tool racecheck "$BUILD/tools/gpu/flashattn_racecheck_probe" "$mode" \
        > "$LOGS/racecheck_probe_$mode.log" 2>&1 || fail "racecheck probe $mode"
    echo "  probe $mode: $(grep -ho "[0-9]* of [0-9]* merged values wrong" "$LOGS/racecheck_probe_$mode.log" | head -1)," \
         "$(grep -o "RACECHECK SUMMARY.*" "$LOGS/racecheck_probe_$mode.log" || echo "no summary")"
  done
  step "compute-sanitizer synccheck (the Hopper forward's named barriers and mbarriers, across persistent items)"
  compute-sanitizer --tool synccheck --error-exitcode 9 "$BUILD/tests/cuda/flashattn_cuda_tests" --gtest_brief=1 \
      --gtest_filter='*Sm90ForwardSmall*d128*:*Sm90ForwardSmall*d64*:*Sm90ForwardVarlen*:*Sm90ForwardPersistent*:*Sm90ForwardPackGqa*d128*:*Sm90ForwardPackGqa*d64*:Sm90ForwardSplit.Deterministic*:*Sm90ForwardSplit*k129*:*Sm90ForwardSharedTails*q203*:*Sm90ForwardSharedTails*q193*' > "$LOGS/synccheck.log" 2>&1 \
      && echo "synccheck: clean" || { tail -30 "$LOGS/synccheck.log"; fail synccheck; }
fi

if has sass; then
  step "SASS instruction mix (sm_90a, per kernel)"
  for obj in "$BUILD"/src/cuda/CMakeFiles/flashattn_cuda.dir/sm80/instantiations/forward_hdim*_bf16.cu.o \
             "$BUILD"/src/cuda/CMakeFiles/flashattn_cuda*.dir/sm90/instantiations/*bf16*.cu.o; do
    cuobjdump -sass -arch sm_90a "$obj" > "$LOGS/sass.txt" 2>/dev/null || continue
    printf "  %-30s" "$(basename "$(dirname "$(dirname "$obj")")")/$(basename "$obj" .cu.o)"
    for op in HMMA HGMMA LDSM LDGSTS UTMALDG SYNCS MUFU.EX2 BAR.SYNC LDL STL; do printf " %s=%s" "$op" "$(grep -c "$op" "$LOGS/sass.txt")"; done
    echo
  done
fi

if has rate; then
  step "tensor-core rate per wgmma shape, A from shared memory (SS) or registers (RS)"
  "$BUILD/tools/gpu/flashattn_wgmma_rate" --ms 30 | tee "$LOGS/wgmma_rate.log"
  step "a softmax tile's exponentials per warp, by where their results are first read"
  "$BUILD/tools/gpu/flashattn_mufu_rate" | tee "$LOGS/mufu_rate.log"
fi

if has gpubench; then
  step "flashattn-bench --device cuda (b1 h16 n16384 d128)"
  for a in "" "--causal --backward"; do
    "$BUILD/tools/bench/flashattn-bench" --device cuda --heads 16 --seqlen 16384 --head-dim 128 $a --json \
        > "$LOGS/flashattn_bench.json" 2> "$LOGS/flashattn_bench.err" || { cat "$LOGS/flashattn_bench.err"; exit 1; }
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print({k: r[k] for k in r if k.startswith(('flash_', 'max_abs', 'bwd_', 'kernel', 'device_name'))})" \
        "$LOGS/flashattn_bench.json"
  done
fi

if has split; then
  step "the sm90 forward's split tail: with and without, shapes around wave boundaries and decode"
  PYTHONUNBUFFERED=1 python3 tools/gpu/split_tail.py --lib "$BUILD/tools/gpu/libflashattn_shim.so" 2>&1 | tee "$LOGS/split_tail.log"
fi

if has timeline; then
  TIMELINE_DIMS=${TIMELINE_DIMS:-128}  # head dims, ;-separated (only 128 has been read so far)
  step "the sm90 forward's timeline within a block (d = ${TIMELINE_DIMS//;/, }, n = 4k and 16k, non-causal)"
  cmake -S . -B build/gpu-timeline -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON \
        -DFLASHATTN_CUDA_HEAD_DIMS="$TIMELINE_DIMS" \
        -DFLASHATTN_CUDA_GENCODE=-gencode=arch=compute_90a,code=sm_90a -DFLASHATTN_BUILD_TESTS=OFF \
        -DCMAKE_CUDA_FLAGS=-DFLASHATTN_SM90_TIMELINE > "$LOGS/timeline_configure.log"
  cmake --build build/gpu-timeline -j "$(nproc)" --target flashattn_shim > "$LOGS/timeline_build.log" 2>&1 ||
    { tail -20 "$LOGS/timeline_build.log"; exit 1; }
  : > "$LOGS/timeline.log"
  for dim in ${TIMELINE_DIMS//;/ }; do
    PYTHONUNBUFFERED=1 python3 tools/gpu/timeline.py --lib build/gpu-timeline/tools/gpu/libflashattn_shim.so \
        --dim "$dim" --seqlens 4096,16384 2>&1 | tee -a "$LOGS/timeline.log"
  done
fi

if has bench; then
  step "forward and backward benchmark beside PyTorch SDPA"
  PYTHONUNBUFFERED=1 python3 tools/gpu/bench_sdpa.py --lib "$BUILD/tools/gpu/libflashattn_shim.so" --json "$LOGS/bench.json" \
      ${BENCH_ARGS:---backward --options} 2>&1 | tee "$LOGS/bench.log"
fi

if ((${#failures[@]})); then echo; echo "FAILED: ${failures[*]}"; exit 1; fi
