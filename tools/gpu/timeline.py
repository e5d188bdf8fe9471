#!/usr/bin/env python3
"""The sm90 forward's timeline within a block, from a timeline build (src/cuda/sm90/timeline.cuh: the
library built with -DFLASHATTN_SM90_TIMELINE in CMAKE_CUDA_FLAGS). The kernel stamps clock64 at named
points of every round (work item) and phase, for its first blocks, one thread per role: the producer
and each consumer warpgroup. This tool runs the benchmark's shape (16k tokens, hidden 2048, bf16) after
a warm-up, then reads one call's stamps and prints, in cycles of the SM clock (medians over the traced
blocks and rounds):
  - each consumer's steady phase: turn to turn (P, every consumer's GEMMs), and from its turn to S done,
    to the softmax's end (the kWait0 stamp: ptxas places the P V wait above the softmax), to P packed;
  - an item's boundary: every event from consumer c's last full phase (the turn of phase N-1) to the
    next item's phase 1, and the excess of that span over 2 P (phase N's P V and phase 0's S are one
    phase's tensor work), which is what an item costs beyond its tiles;
  - the producer's Q and K(0) of the next item on the same clock.

    python3 tools/gpu/timeline.py --lib build/gpu-timeline/tools/gpu/libflashattn_shim.so --seqlens 4096,16384
"""
import argparse
import os
import re
import statistics
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sdpa import SM90, Ours, benchmark_inputs  # noqa: E402

HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "cuda", "sm90", "timeline.cuh")


def layout():
    """timeline.cuh's constants and event numbers, read from the header (one source of truth)."""
    text = open(HEADER).read()
    consts = dict(re.findall(r"\b(k[A-Z]\w*) = (\d+)", re.search(r"inline constexpr int ([^;]*);", text).group(0)))
    events = {name: int(v) for name, v in re.findall(r"^\s+(k\w+) = (\d+),", text, re.M)}
    return {k: int(v) for k, v in consts.items()}, events


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="a timeline build's libflashattn_shim.so")
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--no-split", action="store_true", help="the plain schedule (FLASHATTN_SM90_SPLIT=0)")
    args = ap.parse_args()
    c, ev = layout()
    blocks, roles, rounds, header, phases, per_phase = (c[k] for k in ("kBlocks", "kRoles", "kRounds", "kHeader",
                                                                        "kPhases", "kPerPhase"))
    slots = header + phases * per_phase
    lib = Ours(args.lib)
    buf = torch.zeros(blocks * roles * rounds * slots, dtype=torch.int64, device="cuda")
    os.environ["FLASHATTN_SM90_TIMELINE"] = hex(buf.data_ptr())
    for n in (int(x) for x in args.seqlens.split(",")):
        q, k, v, o, _ = benchmark_inputs(n, args.dim)
        for _ in range(20):
            lib(q, k, v, o, None, args.causal, backend=SM90, split=not args.no_split)
        buf.zero_()
        lib(q, k, v, o, None, args.causal, backend=SM90, split=not args.no_split)
        torch.cuda.synchronize()
        t = buf.view(blocks, roles, rounds, slots).cpu().numpy().astype(np.int64)
        b, _, h, d = q.shape
        print(f"\n== n = {n}, b {b}, h {h}, d {d}, {'causal' if args.causal else 'non-causal'}, "
              f"{'plain' if args.no_split else 'split tail'}: cycles of the SM clock, medians over {blocks} blocks ==")

        def stamp(blk, role, r, slot):
            x = int(t[blk, role, r, slot])
            return x if x != 0 else None

        def ph(blk, role, r, i, e):
            return stamp(blk, role, r, header + per_phase * i + e) if i < phases else None

        def last_phase(blk, role, r):  # N: the last phase index with a turn stamp, + 1
            idx = [i for i in range(1, phases) if ph(blk, role, r, i, ev["kTake"]) is not None]
            return max(idx) + 1 if idx else 0

        # The consumers' roles (1 .. kRoles - 1): those with stamps (the policy's consumer count).
        consumers = [role for role in range(1, roles) if t[:, role].any()]
        print(f"consumers: {len(consumers)}")
        n_of = {(blk, role, r): last_phase(blk, role, r) for blk in range(blocks) for role in consumers
                for r in range(rounds)}

        def n_phases(blk, role, r):
            return n_of[(blk, role, r)]

        def d_(a, b_):
            return None if a is None or b_ is None else b_ - a

        periods = {}  # each consumer's steady turn-to-turn median
        for role in consumers:
            period, to_s, to_pv, to_p, passed, k_ready, v_ready, turn_wait = ([] for _ in range(8))
            for blk in range(blocks):
                for r in range(rounds):
                    N = n_phases(blk, role, r)
                    for i in range(2, N - 1):
                        take = ph(blk, role, r, i, ev["kTake"])
                        period.append(d_(take, ph(blk, role, r, i + 1, ev["kTake"])))
                        to_s.append(d_(take, ph(blk, role, r, i, ev["kWait1"])))
                        to_pv.append(d_(take, ph(blk, role, r, i, ev["kWait0"])))
                        to_p.append(d_(take, ph(blk, role, r, i, ev["kPacked"])))
                        passed.append(d_(take, ph(blk, role, r, i, ev["kPassed"])))
                        # From the previous phase's P packed: K(i) and V(i-1) waited for, then the turn.
                        packed_prev = ph(blk, role, r, i - 1, ev["kPacked"])
                        k_ready.append(d_(packed_prev, ph(blk, role, r, i, ev["kKReady"])))
                        v_ready.append(d_(packed_prev, ph(blk, role, r, i, ev["kVReady"])))
                        turn_wait.append(d_(packed_prev, take))
            periods[role] = median(period)
            print(f"consumer {role - 1} steady phase: turn to turn P = {periods[role]}, turn -> GEMMs issued "
                  f"(turn passed) {median(passed)}, -> S done {median(to_s)}, "
                  f"-> softmax done (kWait0) {median(to_pv)}, -> P packed {median(to_p)}")
            print(f"  from the previous P packed: K(i) landed {median(k_ready)}, V(i-1) {median(v_ready)}, "
                  f"turn taken {median(turn_wait)}")
        # The steady phase's inputs: consumer 1's turn after consumer 0's, and the producer's issue of the
        # tiles phase i reads (K(i) for S(i), V(i-1) for P(i-1) V(i-1)) before consumer 0's turn.
        c1_after, k_ahead, v_ahead = [], [], []
        for blk in range(blocks):
            for r in range(rounds):
                for i in range(2, n_phases(blk, 1, r) - 1):
                    take = ph(blk, 1, r, i, ev["kTake"])
                    c1_after.append(d_(take, ph(blk, 2, r, i, ev["kTake"])))
                    k_ahead.append(d_(ph(blk, 0, r, i, ev["kKLoad"]), take))
                    v_ahead.append(d_(ph(blk, 0, r, i - 1, ev["kVLoad"]), take))
        print(f"steady phase i: consumer 1's turn {median(c1_after)} after consumer 0's; K(i) issued "
              f"{median(k_ahead)} and V(i-1) {median(v_ahead)} before consumer 0's turn")
        P = periods[1]
        names = ["kLastTake", "kLastWait", "kFinal", "kStored", "kTop", "kItem", "kQFull", "kQLoaded", "kFirstTake",
                 "kFirstWait", "kFirstSoft"]
        print(f"item boundary, from consumer c's turn of phase N-1 (0 below), round k -> k + 1 (k + 1's events "
              f"marked '), excess = span - 2 P with P = {P}:")
        print(f"  {'event':>12} " + " ".join(f"{'consumer ' + str(role - 1):>11}" for role in consumers))
        rows = {}
        for role in consumers:
            for blk in range(blocks):
                for r in range(rounds - 1):
                    N, N1 = n_phases(blk, role, r), n_phases(blk, role, r + 1)
                    if N < 3 or N1 < 2 or N >= phases:  # N = kPhases: the item has more phases than stamped
                        continue
                    t0 = ph(blk, role, r, N - 1, ev["kTake"])
                    for name in names[:4]:
                        rows.setdefault((name, ""), {}).setdefault(role, []).append(d_(t0, stamp(blk, role, r,
                                                                                                 ev[name])))
                    for name in names[4:]:
                        rows.setdefault((name, "'"), {}).setdefault(role, []).append(d_(t0, stamp(blk, role, r + 1,
                                                                                                  ev[name])))
                    rows.setdefault(("phase 1 turn", "'"), {}).setdefault(role, []).append(
                        d_(t0, ph(blk, role, r + 1, 1, ev["kTake"])))
                    rows.setdefault(("phase 2 turn", "'"), {}).setdefault(role, []).append(
                        d_(t0, ph(blk, role, r + 1, 2, ev["kTake"])))
                    # the producer, on the same clock: the next item's K(0) and Q issued
                    rows.setdefault(("prod K(0)", "'"), {}).setdefault(role, []).append(
                        d_(t0, ph(blk, 0, r + 1, 0, ev["kKLoad"])))
                    rows.setdefault(("prod Q", "'"), {}).setdefault(role, []).append(
                        d_(t0, stamp(blk, 0, r + 1, ev["kQIssued"])))
        for (name, mark), by_role in rows.items():
            print(f"  {name.lstrip('k') + mark:>12} " + " ".join(f"{median(by_role.get(role, [])) or 0:>11.0f}"
                                                              for role in consumers))
        for role in consumers:
            # the boundary's span: phase N-1's turn to phase 1's
            spans = [x for x in rows.get(("phase 1 turn", "'"), {}).get(role, []) if x is not None]
            if not spans:
                print(f"consumer {role - 1}: no boundary read (items of fewer than 3 phases, or of more than "
                      f"the {phases} stamped)")
                continue
            m = median(spans)
            print(f"consumer {role - 1}: boundary span {m}, excess over 2 P: {m - 2 * P} "
                  f"({len(spans)} boundaries)")
        # The block's start: the producer's first stamp to consumer 0's first turn of phase 1.
        starts = [d_(stamp(blk, 0, 0, ev["kSegment"]), ph(blk, 1, 0, 1, ev["kTake"])) for blk in range(blocks)]
        print(f"ramp: producer's start -> consumer 0's phase 1 turn of round 0: {median(starts)}")


if __name__ == "__main__":
    main()
