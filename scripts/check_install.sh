#!/usr/bin/env bash
# Installs flashattn to a temporary prefix (PRESET's settings, default `cpu`; tests and tools off) and
# builds and runs examples/ against it: the find_package(flashattn) + flashattn::flashattn path a
# user takes. Exits non-zero on any failure.
#   scripts/check_install.sh            (JOBS=N sets build parallelism, default: every core;
#                                        KEEP=1 keeps the temporary directory;
#                                        BUILD=DIR installs from that existing build tree instead,
#                                        with its own settings: no configure, no build)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="${JOBS:-$(nproc)}"
work="$(mktemp -d "${TMPDIR:-/tmp}/flashattn-install.XXXXXX")"
if [[ "${KEEP:-0}" != 1 ]]; then trap 'rm -rf "$work"' EXIT; else echo "keeping $work"; fi

step() { echo "== $*"; }

if [[ -n "${BUILD:-}" ]]; then
  build="$(cd "$BUILD" && pwd)"
else
  preset="${PRESET:-cpu}"
  build="$work/build"
  step "configure the library (preset $preset, tests and tools off)"
  (cd "$root" && cmake --preset "$preset" -B "$build" -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_BUILD_TOOLS=OFF)
  step "build"
  cmake --build "$build" -j "$jobs"
fi
step "install $build to $work/prefix"
cmake --install "$build" --prefix "$work/prefix"

step "configure examples/ against the installed package"
cmake -S "$root/examples" -B "$work/example" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix"
step "build the example"
cmake --build "$work/example" -j "$jobs"
step "run the example"
"$work/example/flashattn_example"
echo "install check passed"
