#!/usr/bin/env bash
# The main job: installs what is missing, configures and builds the `cpu` preset (only the bench
# target), and runs flashattn-bench with the arguments given (none: the default shape, batch 1,
# 8 heads, n = 4096, d = 128, fp32). Idempotent; a second run only re-runs the bench.
#   scripts/bench.sh                   table for the default shape
#   scripts/bench.sh --json            one JSON object on stdout (setup and progress go to stderr)
#   scripts/bench.sh --sweep           time and memory against n: bench-out/sweep.csv and .png
#   scripts/bench.sh --help            every flag
# FLASHATTN_BENCH_BUILD_DIR overrides the build directory (default: the preset's, build/cpu).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "[bench.sh] $*" >&2; }

# Packages: cmake ninja-build g++ libopenblas-dev zlib1g-dev libgtest-dev (skips what is present).
bash scripts/deps.sh >&2

build_dir=${FLASHATTN_BENCH_BUILD_DIR:-build/cpu}
if [[ ! -f $build_dir/CMakeCache.txt ]]; then
  log "configuring the cpu preset in $build_dir"
  cmake --preset cpu -B "$build_dir" >&2
fi
log "building flashattn-bench"
cmake --build "$build_dir" --target flashattn-bench -j "$(nproc)" >&2

exec "$build_dir/tools/bench/flashattn-bench" "$@"
