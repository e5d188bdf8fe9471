#!/usr/bin/env bash
# Runs every test: the Release suite (CUDA code compiled too when nvcc is found), the same suite
# under ASan+UBSan, the installed-package example, and the Python package's pytest suite in a fresh
# virtual environment. Exits non-zero on any failure.
# Usage: scripts/test.sh            (FLASHATTN_TEST_SEED=N replays a run's random inputs)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc)

step() { echo; echo "==== $* ($(date -u +%H:%M:%S))"; }
timed() {  # timed LABEL CMD...: runs CMD, prints its wall time
  local label=$1; shift
  local t0=$(date +%s)
  "$@"
  echo "[time] $label: $(( $(date +%s) - t0 )) s"
}

step "Release build (CUDA compile-only when nvcc is present)"
cmake --preset release >/dev/null
timed "release build" cmake --build --preset release -j "$jobs"

step "Release tests"
timed "release tests" ctest --preset release -j "$jobs"

step "ASan + UBSan build and tests"
cmake --preset asan >/dev/null
timed "asan build" cmake --build --preset asan -j "$jobs"
timed "asan tests" env ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  FLASHATTN_TEST_SANITIZER=1 ctest --preset asan -j "$jobs"

step "Installed package + examples/"
timed "install + example" bash scripts/check_install.sh
if command -v nvcc >/dev/null 2>&1; then
  # The sm90 d = 128 kernel with shared tails on (policy.hpp's FLASHATTN_SM90_SHARE_TAILS, on by
  # default; CMake can switch it off): compiled, and failing on any register spill or wgmma
  # serialization (ptxas C7511: the first version of the tail groups, the path before it, had it).
  step "sm90 forward with shared tails (compile-only, d = 128)"
  t0=$(date +%s)
  nvcc -Iinclude -Isrc -O3 -DNDEBUG -DFLASHATTN_SM90_SHARE_TAILS=1 -gencode=arch=compute_90a,code=sm_90a \
       --expt-relaxed-constexpr -Xptxas=-v -std=c++17 -x cu -c src/cuda/sm90/instantiations/forward_hdim128_bf16.cu \
       -o /dev/null 2> build/shared_tails_ptxas.log || { cat build/shared_tails_ptxas.log; exit 1; }
  if grep -E "[1-9][0-9]* bytes spill (stores|loads)|C7511" build/shared_tails_ptxas.log; then
    echo "the shared-tail kernel spills registers or has its wgmmas serialized (C7511)"; exit 1
  fi
  grep -c "0 bytes spill stores" build/shared_tails_ptxas.log | xargs echo "kernels without spills:"
  echo "[time] shared tails compile: $(( $(date +%s) - t0 )) s"
  # The rounds resolved ahead with the early Q release (policy.hpp's FLASHATTN_SM90_RESOLVE_AHEAD,
  # off by default, not yet measured): compiled in, the same checks.
  step "sm90 forward with the rounds resolved ahead (compile-only, d = 128)"
  t0=$(date +%s)
  nvcc -Iinclude -Isrc -O3 -DNDEBUG -DFLASHATTN_SM90_RESOLVE_AHEAD=1 -gencode=arch=compute_90a,code=sm_90a \
       --expt-relaxed-constexpr -Xptxas=-v -std=c++17 -x cu -c src/cuda/sm90/instantiations/forward_hdim128_bf16.cu \
       -o /dev/null 2> build/resolve_ahead_ptxas.log || { cat build/resolve_ahead_ptxas.log; exit 1; }
  if grep -E "[1-9][0-9]* bytes spill (stores|loads)|C7511" build/resolve_ahead_ptxas.log; then
    echo "the kernel with the rounds resolved ahead spills registers or has its wgmmas serialized (C7511)"; exit 1
  fi
  echo "[time] resolve-ahead compile: $(( $(date +%s) - t0 )) s"
  # From the Release tree built above (its CUDA code compiled once, not again for this check).
  step "Installed package with the CUDA backends + examples/"
  timed "install (CUDA) + example" env BUILD=build/release bash scripts/check_install.sh
fi

step "Python package (fresh venv: pip install ., pytest tests/python)"
timed "python package" bash scripts/test_python.sh

echo
echo "all tests passed"
