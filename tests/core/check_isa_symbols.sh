#!/usr/bin/env bash
# No inline-function symbol may be defined both by an ISA-specific object (*.avx512.cpp.o,
# *.avx2.cpp.o) and by an object of another ISA: the linker keeps one copy, which could then be an
# AVX-512 one reached on a CPU without AVX-512 (src/core/isa_namespace.hpp). Usage: $0 libflashattn.a
set -euo pipefail
lib=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && ar x "$lib")
for o in "$tmp"/*.o; do
  case $o in *.avx512.cpp.o) isa=avx512 ;; *.avx2.cpp.o) isa=avx2 ;; *) isa=base ;; esac
  nm --defined-only "$o" | awk -v isa=$isa '$2 ~ /^[WV]$/ && $3 !~ /personality/ {print $3, isa}'
done | sort -u | awk '{ isas[$1] = isas[$1] " " $2; n[$1]++ } END { bad = 0
  for (s in n) if (n[s] > 1) { print "shared across ISAs:" isas[s] ": " s; bad++ }
  print bad " symbols shared across ISA-specific objects"; exit bad > 0 }'
