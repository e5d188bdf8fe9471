#!/usr/bin/env bash
# Builds the Python package in a fresh virtual environment (`pip install .`, timed; no torch needed),
# checks that `import flashattn` works without torch, then runs pytest tests/python.
# Exits non-zero on any failure.
#
#   FLASHATTN_PY_VENV=DIR   where to create the venv (default: a temporary folder, removed afterwards)
#   FLASHATTN_PY_TORCH=1    also install torch from PyPI and run the torch tests (a large download)
#   FLASHATTN_TEST_SEED=N   replays a run's random inputs
#   SKBUILD_CMAKE_DEFINE    e.g. "FLASHATTN_CUDA=OFF" for a CPU-only build on a machine with nvcc
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -n "${FLASHATTN_PY_VENV:-}" ]]; then
  venv=$FLASHATTN_PY_VENV
else
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  venv=$tmp/venv
fi
python3 -m venv "$venv"
py=$venv/bin/python

step() { echo; echo "==== $* ($(date -u +%H:%M:%S))"; }

step "pip install . (fresh venv, isolated build)"
t0=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} "$py" -m pip install --quiet --no-cache-dir .
echo "[time] pip install .: $(( $(date +%s) - t0 )) s"

step "import flashattn without torch"
"$py" -c "import sys, flashattn; assert 'torch' not in sys.modules; print('flashattn', flashattn.__version__, 'CUDA' if flashattn.HAS_CUDA else 'CPU-only')"

step "test dependencies"
"$py" -m pip install --quiet pytest numpy ml_dtypes
if [[ "${FLASHATTN_PY_TORCH:-0}" == 1 ]]; then
  "$py" -m pip install --quiet torch
fi

step "pytest tests/python"
t0=$(date +%s)
(cd tests/python && "$py" -m pytest -q -p no:cacheprovider .)
echo "[time] pytest: $(( $(date +%s) - t0 )) s"
