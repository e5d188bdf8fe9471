#!/usr/bin/env bash
# A/B of the sm90 forward on a GPU machine, in one process: the shims of a base commit (git archive of
# BASE, default main) and of this working tree, built side by side for a few head dims, then
# tools/gpu/compare_backward.py --forward sm90 times both beside cuDNN and flash, interleaved. With
# TESTS=1 (the default) the working tree's *Sm90* GPU tests run first (cases of head dims not built
# fail by design; the summary counts failures by head dim).
#
#   scripts/gpu_ab.sh                                  main against the working tree, d = 64 and 128
#   BASE=f299770 HEAD_DIMS="128" DIMS=128 scripts/gpu_ab.sh
#   SEQLENS=4096,8192 CAUSAL=no TESTS=0 scripts/gpu_ab.sh
#   REFS="k-ahead exp2-poly" scripts/gpu_ab.sh         more commits (branches) timed in the same process,
#                                                      as columns r1, r2, ...
#   EXTRA_LIBS="tree-noshare=build/ab/tree/tools/gpu/libflashattn_shim.so:noshare" scripts/gpu_ab.sh
#                                                      more columns: compare_backward.py --lib specs
#   TEST_FILTER='*Sm90ForwardTailGroups*' scripts/gpu_ab.sh   fewer tests (default *Sm90*)
#   TREE_CMAKE_ARGS=-DFLASHATTN_SM90_NARROW_TAIL=ON scripts/gpu_ab.sh   the tree's builds (shim, tests)
#                                                      configured with more options
#   VARIANTS="narrow=-DFLASHATTN_SM90_NARROW_TAIL=ON;q2=-DFLASHATTN_SM90_SECOND_Q=ON -DFLASHATTN_SM90_ONES_ATOM=ON"
#       scripts/gpu_ab.sh                              more shims of this working tree, each configured
#                                                      with its options, timed as columns of their names
#   COMPARE_ARGS="--rounds 40 --reps 8" scripts/gpu_ab.sh   longer timing (compare_backward.py's options)
#   REFS="k-ahead" scripts/gpu_ab.sh --prepare         only extract the commits' sources into build/ab-src;
#                                                      on the device: carry build/ab-src, AB_PREPARED=1
# Builds go to build/ab (base, tree and each ref) and build/ab-tests; the commits' sources to
# build/ab-src.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${BASE:-main}
HEAD_DIMS=${HEAD_DIMS:-"64;128"}
DIMS=${DIMS:-${HEAD_DIMS//;/,}}
SEQLENS=${SEQLENS:-2048,4096,8192,16384}
CAUSAL=${CAUSAL:-both}
TESTS=${TESTS:-1}
REFS=${REFS:-}
GENCODE=-gencode=arch=compute_90a,code=sm_90a
ROOT=$(pwd)

if [[ ${AB_PREPARED:-0} != 1 ]]; then
  # the commits' sources, extracted here. The device's copy of the checkout holds neither this branch
  # nor the refs: run `scripts/gpu_ab.sh --prepare` here, carry build/ab-src, and set AB_PREPARED=1 there
  rm -rf build/ab-src && mkdir -p build/ab-src/base
  git archive "$BASE" | tar -x -C build/ab-src/base
  echo "base: $BASE = $(git rev-parse --short "$BASE"); tree: $(git rev-parse --short HEAD) + working changes" \
      > build/ab-src/names.txt
  i=0
  for ref in $REFS; do
    i=$((i + 1))
    mkdir -p "build/ab-src/r$i" && git archive "$ref" | tar -x -C "build/ab-src/r$i"
    echo "r$i: $ref = $(git rev-parse --short "$ref")" >> build/ab-src/names.txt
  done
  [[ ${1:-} == --prepare ]] && { cat build/ab-src/names.txt; echo "prepared build/ab-src: carry it"; exit 0; }
fi
[[ -f build/ab-src/names.txt ]] || { echo "no build/ab-src: run scripts/gpu_ab.sh --prepare where git is"; exit 1; }
cat build/ab-src/names.txt
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader || true
mkdir -p build/ab
names=(base)  # the refs' columns are r1, r2, ... (the table's columns are 7 characters wide)
for dir in build/ab-src/r*; do [[ -d $dir ]] && names+=("$(basename "$dir")"); done
configure() {  # source dir, build dir, extra cmake args...
  local src=$1 dir=$2
  shift 2
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON \
        -DFLASHATTN_CUDA_HEAD_DIMS="$HEAD_DIMS" -DFLASHATTN_CUDA_GENCODE=$GENCODE "$@" > "$dir.configure.log"
}
variants=()  # VARIANTS: name=cmake args, separated by ';'
IFS=';' read -r -a variants <<< "${VARIANTS:-}"
builds=$(( 1 + ${#names[@]} + ${#variants[@]} + TESTS ))
par=$(( $(nproc) / builds > 0 ? $(nproc) / builds : 1 ))
t0=$(date +%s)
pids=()
libs=()
# A shim (name, source dir, extra cmake args...), built in the background: a column of the table.
shim() {
  local name=$1 src=$2
  shift 2
  ( configure "$src" "$ROOT/build/ab/$name" -DFLASHATTN_BUILD_TESTS=OFF "$@" &&
    cmake --build "$ROOT/build/ab/$name" -j "$par" --target flashattn_shim > "$ROOT/build/ab/$name.log" 2>&1 ) &
  pids+=($!)
  libs+=(--lib "$name=build/ab/$name/tools/gpu/libflashattn_shim.so")
}
# In the table's column order: the commits', the tree's (this checkout), then the tree's variants.
for name in "${names[@]}"; do shim "$name" "build/ab-src/$name"; done
shim tree . ${TREE_CMAKE_ARGS:-}
for variant in "${variants[@]}"; do shim "${variant%%=*}" . ${variant#*=}; done
if [[ $TESTS == 1 ]]; then
  ( configure . "$ROOT/build/ab-tests" ${TREE_CMAKE_ARGS:-} &&
    cmake --build "$ROOT/build/ab-tests" -j "$par" --target flashattn_cuda_tests > "$ROOT/build/ab-tests.log" 2>&1 ) &
  pids+=($!)
fi
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
if [[ $failed == 1 ]]; then
  for log in build/ab/*.log build/ab-tests.log; do [[ -f $log ]] && tail -20 "$log"; done
  echo "a build failed"; exit 1
fi
echo "[time] builds: $(( $(date +%s) - t0 )) s"
grep -h "spill" build/ab/tree.log | sort | uniq -c || true

if [[ $TESTS == 1 ]]; then
  # bounded (TEST_TIMEOUT s, default 300): a kernel that hangs must not take the timing run with it
  timeout "${TEST_TIMEOUT:-300}" build/ab-tests/tests/cuda/flashattn_cuda_tests --gtest_filter="${TEST_FILTER:-*Sm90*}" \
      > build/ab-tests.run.log 2>&1 || echo "the tests exited with $? (124: timed out)"
  grep -E "^\[  PASSED|tests ran" build/ab-tests.run.log || true
  echo "failed, by head dim (dims not built fail by design: built $HEAD_DIMS):"
  grep -E "^\[  FAILED  \]" build/ab-tests.run.log | grep -oE "_d[0-9]+" | sort | uniq -c || true
  built="_d(${HEAD_DIMS//;/|})([^0-9]|$)"  # failures of the built head dims are real: named in full
  grep -E "^\[  FAILED  \]" build/ab-tests.run.log | grep -E "$built" | sort -u | head -20 || true
  echo "failed, of no head dim (rule tests: their head dims are in the test, the built ones may serve them):"
  grep -E "^\[  FAILED  \]" build/ab-tests.run.log | grep -vE "_d[0-9]+|FAILED TESTS| tests, listed" | sort -u || true
fi

for spec in ${EXTRA_LIBS:-}; do libs+=(--lib "$spec"); done
PYTHONUNBUFFERED=1 python3 tools/gpu/compare_backward.py --forward sm90 --causal "$CAUSAL" --dims "$DIMS" \
    --seqlens "$SEQLENS" ${COMPARE_ARGS:-} "${libs[@]}"
