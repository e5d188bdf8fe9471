#!/usr/bin/env python3
"""Checks where compute-sanitizer racecheck's hazards lie in the SASS: every reported pair must be a
shared store and a shared load with a named barrier over `--meet-threads` threads between them, inside
the stretch of code those barriers span (the shared tail's merge: src/cuda/sm90/shared_tail.cuh, three
meets over the three consumers' 384 threads). Racecheck reports such pairs though the barrier orders
them, where other barriers have bar.arrive pending (the ring of turns): tools/gpu/racecheck_probe.cu
shows it on a kernel of its own whose merged values are exact. Any other hazard, anywhere in any
kernel, fails.

    python3 tools/gpu/racecheck_sites.py racecheck.log build/gpu/tests/cuda/flashattn_cuda_tests
"""
import argparse
import collections
import re
import subprocess
import sys

REPORT = re.compile(r"Race reported between (\w+) access at (.+?)\+0x([0-9a-f]+)\s*$")
SECOND = re.compile(r"and (\w+) access at (.+?)\+0x([0-9a-f]+)\s*(\[\d+ hazards\])?")
FUNCTION = re.compile(r"Function : (\S+)")
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")


def normalise(name):
    """racecheck's and c++filt's spellings of a kernel's name, made the same."""
    name = re.sub(r"\((?:int|unsigned int|long)\)(-?\d+)", r"\1", name)
    name = name.replace("(bool)0", "false").replace("(bool)1", "true").replace("(anonymous namespace)", "<unnamed>")
    return re.sub(r"\s+", "", name)


def hazards(log):
    """(kernel, write pc, read pc, count text) of each reported pair (either access may come first)."""
    lines = open(log, errors="replace").read().splitlines()
    out = []
    for i, line in enumerate(lines):
        m = REPORT.search(line)
        if not m or i + 1 >= len(lines):
            continue
        n = SECOND.search(lines[i + 1])
        if not n:
            raise SystemExit(f"{log}:{i + 2}: no second access after a race report")
        accesses = {m.group(1): int(m.group(3), 16), n.group(1): int(n.group(3), 16)}
        if set(accesses) != {"Write", "Read"}:
            out.append((normalise(m.group(2)), None, None, line.strip()))
            continue
        out.append((normalise(m.group(2)), accesses["Write"], accesses["Read"], n.group(4) or ""))
    return out


def sass_of(binary, kernels):
    """{kernel: {pc: instruction}} for the named kernels, from cuobjdump -sass."""
    dump = subprocess.run(["cuobjdump", "-sass", binary], capture_output=True, text=True, check=True).stdout
    mangled = sorted(set(FUNCTION.findall(dump)))
    demangled = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True,
                               check=True).stdout.splitlines()
    wanted = {m: name for m, name in zip(mangled, map(normalise, demangled)) if name in kernels}
    code, current = collections.defaultdict(dict), None
    for line in dump.splitlines():
        f = FUNCTION.search(line)
        if f:
            current = wanted.get(f.group(1))
            continue
        i = INSTRUCTION.search(line)
        if current and i:
            code[current].setdefault(int(i.group(1), 16), i.group(2).strip())  # the first cubin's copy
    return code


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log", help="compute-sanitizer --tool racecheck output")
    ap.add_argument("binary", help="the binary it ran (its SASS, through cuobjdump)")
    ap.add_argument("--meet-threads", type=int, default=384, help="the meets' barrier thread count")
    args = ap.parse_args()
    found = hazards(args.log)
    if not found:
        print("racecheck sites: no hazards reported")
        return 0
    code = sass_of(args.binary, {k for k, *_ in found})
    meet = re.compile(rf"^BAR\.SYNC(\.DEFER_BLOCKING)? 0x[0-9a-f]+, 0x{args.meet_threads:x}$")
    bad, sites = [], 0
    for kernel, write, read, note in found:
        sass = code.get(kernel)
        if write is None or not sass:
            bad.append(f"{kernel}: {note if write is None else 'no SASS found for the kernel'}")
            continue
        meets = sorted(pc for pc, ins in sass.items() if meet.match(ins))
        between = [pc for pc in meets if min(write, read) < pc < max(write, read)]
        ok = bool(sass.get(write, "").startswith("STS") and sass.get(read, "").startswith("LDS") and write < read
              and between and meets[0] < write and read < meets[-1] + 0x1000)
        sites += ok
        if not ok:
            bad.append(f"{kernel}: write +{write:#x} ({sass.get(write, '?')}), read +{read:#x} "
                       f"({sass.get(read, '?')}) {note}: not a store and a later load across a meet")
    print(f"racecheck sites: {len(found)} reported, {sites} a shared store and a later load across a meet "
          f"barrier of {args.meet_threads} threads")
    for line in bad:
        print("  OTHER HAZARD:", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
