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
  # The sm90 d = 128 kernel with a policy switch compiled in (policy.hpp): compiled, and failing on
  # any register spill or wgmma serialization (ptxas C7511: the first version of the tail groups, the
  # path before it, had it). $1: what, $2: the defines (set to 1; space-separated), $3: the log's name.
  sm90_compile_check() {
    step "sm90 forward with $1 (compile-only, d = 128)"
    local t0 log=build/$3_ptxas.log
    t0=$(date +%s)
    local defines=() d
    for d in $2; do defines+=("-D$d=1"); done
    nvcc -Iinclude -Isrc -O3 -DNDEBUG "${defines[@]}" -gencode=arch=compute_90a,code=sm_90a \
         --expt-relaxed-constexpr -Xptxas=-v -std=c++17 -x cu -c src/cuda/sm90/instantiations/forward_hdim128_bf16.cu \
         -o /dev/null 2> "$log" || { cat "$log"; exit 1; }
    if grep -E "[1-9][0-9]* bytes spill (stores|loads)|C7511" "$log"; then
      echo "the kernel with $1 spills registers or has its wgmmas serialized (C7511)"; exit 1
    fi
    grep -c "0 bytes spill stores" "$log" | xargs echo "kernels without spills:"
    echo "[time] $3 compile: $(( $(date +%s) - t0 )) s"
  }
  # Shared tails: on by default (CMake can switch them off).
  sm90_compile_check "shared tails" FLASHATTN_SM90_SHARE_TAILS shared_tails
  # The narrow first tile: off until measured on a GPU (a width of 48 keys serialized the wgmmas).
  sm90_compile_check "the narrow first tile" FLASHATTN_SM90_NARROW_TAIL narrow_tail
  # The second Q tile (row sums in the softmax): off until measured on a GPU.
  sm90_compile_check "the second Q tile" FLASHATTN_SM90_SECOND_Q second_q
  # The row sums on one ones atom, alone and with the second Q tile (all three switches together
  # serialize the wgmmas: not a combination to build).
  sm90_compile_check "the ones atom" FLASHATTN_SM90_ONES_ATOM ones_atom
  sm90_compile_check "the second Q tile and the ones atom" "FLASHATTN_SM90_SECOND_Q FLASHATTN_SM90_ONES_ATOM" second_q_ones
  # From the Release tree built above (its CUDA code compiled once, not again for this check).
  step "Installed package with the CUDA backends + examples/"
  timed "install (CUDA) + example" env BUILD=build/release bash scripts/check_install.sh
fi

step "Python package (fresh venv: pip install ., pytest tests/python)"
timed "python package" bash scripts/test_python.sh

echo
echo "all tests passed"
