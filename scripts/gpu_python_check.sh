#!/usr/bin/env bash
# The Python package on a GPU machine (an H200 here, no internet; torch, transformers, nanobind and
# scikit-build-core already installed): builds flashattn with CUDA into a target folder (pip, no
# build isolation, no downloads), runs pytest on tests/python file by file (the CUDA tests included:
# test_torch_cuda.py, test_llama_cuda.py, the CuPy test), then tools/gpu/python_overhead.py and
# tools/gpu/bench_deterministic.py, and prints a short table last. Exits non-zero when the build, a
# test file, the overhead bar or the deterministic backward's same-bits check fails.
#
#   FLASHATTN_CUDA_HEAD_DIMS  head dims to build (default "64;128": a short build; the test shapes with
#                             other head dims are deselected). "64;96;128;192;256" builds them all.
#   FLASHATTN_CUDA_GENCODE    default sm_90a only (the H200)
#   TEST_FILES                default: every tests/python/test_*.py, the CUDA ones first
# Logs go to $OUT (or build/gpu-python-check), the build to build/gpu-python.
set -euo pipefail
cd "$(dirname "$0")/.."
LOGS=${OUT:-build/gpu-python-check}
BUILD=$PWD/build/gpu-python
SITE=$BUILD/site
HEAD_DIMS=${FLASHATTN_CUDA_HEAD_DIMS:-"64;128"}
GENCODE=${FLASHATTN_CUDA_GENCODE:-"-gencode=arch=compute_90a,code=sm_90a"}
mkdir -p "$LOGS" "$BUILD"
step() { echo; echo "==== $* ($(date -u +%H:%M:%S))"; }
export PYTHONUNBUFFERED=1
export JAX_PLATFORMS=cpu  # the JAX test is of JAX arrays on the CPU (GPU ones are refused by design)

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
python3 -c "import transformers; print('transformers', transformers.__version__)" || true

step "build: pip install --no-build-isolation --target (head dims $HEAD_DIMS)"
t0=$(date +%s)
rm -rf "$SITE"
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install --no-build-isolation --no-deps --no-cache-dir \
    --target "$SITE" -C build-dir="$BUILD/cmake" -C cmake.define.FLASHATTN_CUDA=ON \
    -C "cmake.define.FLASHATTN_CUDA_HEAD_DIMS=$HEAD_DIMS" -C "cmake.define.FLASHATTN_CUDA_GENCODE=$GENCODE" \
    -v . > "$LOGS/build.log" 2>&1 || { tail -60 "$LOGS/build.log"; echo "BUILD FAILED"; exit 1; }
build_s=$(( $(date +%s) - t0 ))
echo "[time] build: $build_s s"
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
python3 -c "import flashattn; assert flashattn.HAS_CUDA, 'built without CUDA'; print('flashattn', flashattn.__version__, 'CUDA')"

# Test shapes whose head dim was not built are deselected (their ids end in x<head_dim>).
deselect=""
for d in 64 96 128 192 256; do
  [[ ";$HEAD_DIMS;" == *";$d;"* ]] || deselect+="${deselect:+ and }not x$d"
done

files=${TEST_FILES:-"test_torch_cuda.py test_llama_cuda.py test_other_arrays.py test_torch_cpu.py test_numpy.py"}
declare -A summary
status=0
orc=skipped
overhead() {
  step "per-call overhead (tools/gpu/python_overhead.py)"
  set +e
  timeout 120 python3 tools/gpu/python_overhead.py --json "$LOGS/overhead.json" 2>&1 | tee "$LOGS/overhead.log"
  orc=${PIPESTATUS[0]}
  set -e
  [[ $orc == 0 ]] || status=1
}
for f in $files; do
  [[ $f == test_other_arrays.py ]] && overhead  # after the GPU tests, before the CPU ones
  step "pytest $f"
  t0=$(date +%s)
  set +e
  (cd tests/python && timeout 150 python3 -m pytest -q -s -p no:cacheprovider -rfEs ${deselect:+-k "$deselect"} "$f") \
      > "$LOGS/pytest_${f%.py}.log" 2>&1
  rc=$?
  set -e
  grep -E "^(FAILED|ERROR)|passed|failed|error|no tests ran" "$LOGS/pytest_${f%.py}.log" | tail -15 || true
  line=$(grep -E "(passed|failed|skipped|error|no tests ran).* in [0-9.]+s" "$LOGS/pytest_${f%.py}.log" | tail -1 | tr -d '=' || true)
  [[ $rc == 124 ]] && line="TIMED OUT after 150 s; $line"
  summary[$f]="rc=$rc ${line:-no summary (see log)} [$(( $(date +%s) - t0 )) s]"
  [[ $rc == 0 ]] || status=1
done
grep -ho "logits: flashattn.*\|losses {.*\|cached decoding logits.*" "$LOGS"/pytest_test_llama_cuda.log 2>/dev/null || true

[[ $orc == skipped ]] && overhead

step "deterministic backward: speed and same bits (tools/gpu/bench_deterministic.py)"
dims=""
for d in 64 128 256; do [[ ";$HEAD_DIMS;" == *";$d;"* ]] && dims+="${dims:+,}$d"; done
set +e
timeout 200 python3 tools/gpu/bench_deterministic.py --dims "$dims" 2>&1 | tee "$LOGS/deterministic.log"
drc=${PIPESTATUS[0]}
set -e
[[ $drc == 0 ]] || status=1

step "summary"
echo "  build ($HEAD_DIMS, $GENCODE): $build_s s"
for f in $files; do printf "  %-22s %s\n" "$f" "${summary[$f]}"; done
grep -E "^\s+(torch SDPA|flashattn.attention |_ext)|^\[bar\]" "$LOGS/overhead.log" 2>/dev/null | sed 's/^ */  /' \
    || echo "  overhead: no result (rc=$orc)"
exit $status
