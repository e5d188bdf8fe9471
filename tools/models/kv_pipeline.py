#!/usr/bin/env python3
"""A model of the sm90 forward's K/V pipeline (forward_kernel.cuh) with shared tails, run over random
interleavings: one producer issuing K/V tiles into S = 3 slots per ring after each slot's empty
barrier passes (an item's order K(0), V(0), K(1), V(1), ...; a shared tail's K(0), K(1), K(2), then
K(i + 3), V(i) for each i), a TMA unit landing the copies in any order, and C = 3 consumers waiting
by parity (mbarrier try_wait.parity: only the parity of the phase is known) and releasing. Ordinary
items: every consumer waits for and releases every tile. Shared tails: consumer c reads every third
tile from c (its own slot), and releases it with one arrival counting C; a share one tile shorter
than consumer 0's takes one empty turn more; the consumers meet after the walk. Both take their GEMM
phases in the ring of turns (consumer 0, 1, 2, 0, ...; a phase waits for its tiles before its turn
and releases them after). Checked: no deadlock, and every read sees its own tile,
unchanged until released; as the kernel runs (turns and the meeting), and with the meeting alone
(the turns keep the consumers within a phase of each other, so the meeting is what holds without
them). A third pass drops both and must find failures (a consumer waiting by parity on a slot two
phases behind), so that the model is shown able to fail.

    python3 tools/models/kv_pipeline.py [runs]
"""
import random
import sys

S = 3  # stages
C = 3  # consumers

class Bar:
    def __init__(self, expected):
        self.expected, self.arrived, self.completed = expected, 0, 0
    def arrive(self, n=1):
        self.arrived += n
        assert self.arrived <= self.expected, "over-arrival"
        if self.arrived == self.expected:
            self.arrived, self.completed = 0, self.completed + 1
    def passed(self, parity):  # try_wait.parity: the phase of this parity has completed
        return (self.completed & 1) != parity

def parity_of(g): return (g // S) & 1

def run(seed, items, meet=True, ring=True):
    rng = random.Random(seed)
    full = {x: [Bar(1) for _ in range(S)] for x in "kv"}
    empty = {x: [Bar(C) for _ in range(S)] for x in "kv"}
    content = {x: [None] * S for x in "kv"}
    in_flight = []  # (x, slot, tile)
    end_bar = {"arrived": 0, "gen": 0}

    def producer():
        g = 0
        for kind, t in items:
            n = t
            order = []
            if kind == "shared":
                order += [("k", i) for i in range(min(3, n))]
                for i in range(n):
                    if i + 3 < n: order.append(("k", i + 3))
                    order.append(("v", i))
            else:
                for i in range(n):
                    order.append(("k", i))
                    order.append(("v", i))
            for x, i in order:
                tile = g + i
                s = tile % S
                while not empty[x][s].passed(parity_of(tile) ^ 1):
                    yield
                in_flight.append((x, s, tile))
                yield
            g += n

    def land():  # the TMA unit: lands an issued copy at a random time
        while True:
            if in_flight and rng.random() < 0.5:
                x, s, tile = in_flight.pop(rng.randrange(len(in_flight)))
                content[x][s] = tile
                full[x][s].arrive()
            yield

    turn = {"c": 0}  # the ring of turns: whose GEMMs issue next

    def consumer(c):
        g = 0
        for kind, t in items:
            n = t
            mine = list(range(g + c, g + n, 3)) if kind == "shared" else list(range(g, g + n))
            count = C if kind == "shared" else 1
            # Phases 0 .. len(mine): phase j waits for K(j) and V(j - 1), takes its turn, issues
            # S(j) and P V(j - 1), passes the turn, and releases both once read; a shorter share's
            # last phase is an empty turn (need nothing).
            phases = len(range(g, g + n, 3)) + 1 if kind == "shared" else n + 1
            for j in range(phases):
                need = ([("k", mine[j])] if j < len(mine) else []) + ([("v", mine[j - 1])] if 0 < j <= len(mine) else [])
                for x, tile in need:
                    s = tile % S
                    while not full[x][s].passed(parity_of(tile)):
                        yield
                while ring and turn["c"] != c:
                    yield
                for x, tile in need:
                    s = tile % S
                    assert content[x][s] == tile, f"consumer {c} read {x} slot {s}: tile {content[x][s]}, wanted {tile}"
                turn["c"] = (c + 1) % C
                for _ in range(rng.randrange(3)):
                    yield
                    for x, tile in need:
                        assert content[x][tile % S] == tile, f"consumer {c}: {x} slot {tile % S} overwritten while read"
                for x, tile in need:
                    empty[x][tile % S].arrive(count)
                yield
            if kind == "shared" and meet:
                gen = end_bar["gen"]
                end_bar["arrived"] += 1
                if end_bar["arrived"] == C:
                    end_bar["arrived"], end_bar["gen"] = 0, gen + 1
                while end_bar["gen"] == gen:
                    yield
            g += n

    agents = {"p": producer(), **{f"c{c}": consumer(c) for c in range(C)}}
    lander = land()
    steps = 0
    while agents:
        steps += 1
        if steps > 200000:
            return "deadlock"
        name = rng.choice(list(agents) + ["tma"])
        if name == "tma":
            next(lander)
            continue
        try:
            next(agents[name])
        except StopIteration:
            del agents[name]
        except AssertionError as e:
            return str(e)
    return None

runs = int(sys.argv[1]) if len(sys.argv) > 1 else 2000


def failures(**kw):
    bad = 0
    for seed in range(runs):
        rng = random.Random(seed * 7 + 1)
        items = [(kind, rng.randint(3, 8) if kind == "shared" else rng.randint(1, 4))
                 for kind in (rng.choice(["shared", "item", "item"]) for _ in range(rng.randint(2, 6)))]
        r = run(seed, items, **kw)
        if r:
            bad += 1
            if bad <= 3 and kw.get("meet", True):
                print("  seed", seed, items, r)
    return bad


kernel = failures()  # the kernel: turns and the meeting
no_ring = failures(ring=False)  # the meeting alone keeps it right
sanity = failures(ring=False, meet=False)  # neither: a consumer lags a slot by two phases
print(f"failures: {kernel} of {runs} runs (turns and the meeting), {no_ring} (the meeting, no turns), "
      f"{sanity} (neither: must be > 0, the model able to fail)")
sys.exit(1 if kernel or no_ring or sanity == 0 else 0)
