#!/usr/bin/env bash
# Installs what building and testing flashattn needs on a fresh Debian/Ubuntu machine; skips what is there.
set -euo pipefail
pkgs=(cmake ninja-build g++ libgtest-dev libopenblas-dev zlib1g-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[deps] installing: ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi
