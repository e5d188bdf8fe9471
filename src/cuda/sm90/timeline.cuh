// A timeline of the Hopper forward's roles, for measurements only (tools/gpu/timeline.py): built with
// FLASHATTN_SM90_TIMELINE defined, the kernel stamps clock64 at named points of each round (item) and
// phase into p.timeline, for the first kBlocks blocks and kRounds rounds, one thread per role (the
// producer's, and thread 0 of each consumer warpgroup; a policy of fewer consumers leaves the last
// roles' records zero). Without the macro mark() is empty and the kernel's code is unchanged.
// Record (block, role, round, slot) at
//   ((block kRoles + role) kRounds + round) kRoundSlots + slot,
// slot = a Header event, or kHeader + kPerPhase phase + a Phase event (phase = the item's tile index; for the
// producer, tile i's loads).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/sm90/policy.hpp"  // ForwardTiles::kMaxConsumers

namespace flashattn::detail::sm90::timeline {

inline constexpr int kBlocks = 8, kRoles = 4, kRounds = 24, kHeader = 16, kPhases = 136, kPerPhase = 7;
inline constexpr int kRoundSlots = kHeader + kPhases * kPerPhase;
inline constexpr size_t kRecords = size_t{kBlocks} * kRoles * kRounds * kRoundSlots;
static_assert(kRoles == 1 + ForwardTiles::kMaxConsumers, "a role for the producer and each consumer warpgroup");

// Round events (slots 0 .. kHeader - 1). Consumers:
enum Header : int {
  kTop = 0,        // the round's start, before the item_full wait
  kItem = 1,       // item_full passed
  kQFull = 2,      // q_full passed
  kQLoaded = 3,    // Q's registers loaded (ldmatrix issued), Q released
  kFirstTake = 4,  // the first phase's turn taken
  kFirstWait = 5,  // S(first) done
  kFirstSoft = 6,  // its softmax and P done
  kLastTake = 7,   // phase N's turn taken (P(N-1) V(N-1) alone)
  kLastWait = 8,   // P(N-1) V(N-1) done
  kFinal = 9,      // 1 / l and lse (after a split part's merge)
  kStored = 10,    // the epilogue's stores issued
  // Producer:
  kSegment = 0,    // the round's start (block_segment); slot 1 unused
  kPublished = 2,  // q_empty passed, item_full arrived (K(0): phase 0's kKLoad)
  kQIssued = 3,    // Q's TMA issued
};
// Phase events (phase i = tile i of the item). Consumers, for 0 < i < N:
enum Phase : int {
  kTake = 0,    // the turn taken (S(i) and P(i-1) V(i-1) about to issue)
  kWait1 = 1,   // S(i) done (wait<1>, or wait<0> in masked phases)
  kWait0 = 2,   // after wgmma_wait<0> in the source; without exp_under_pv ptxas hoists that wait above
                // the softmax of S(i) and this stamp stays after its exponentials (SASS, d = 128):
                // it reads the softmax's end
  kPacked = 3,  // softmax of S(i) and P(i) done
  kKReady = 4,  // K(i) landed (its full barrier passed), before the turn
  kVReady = 5,  // V(i-1) landed, before the turn
  kPassed = 6,  // S(i) and P(i-1) V(i-1) issued, the turn passed on
  // Producer: tile i's loads issued (after their empty waits)
  kKLoad = 0,
  kVLoad = 1,
};

// The calling thread's role is its warpgroup (0: the producer, 1 + c: consumer c).
__device__ __forceinline__ void mark([[maybe_unused]] uint64_t* buf, [[maybe_unused]] int round,
                                     [[maybe_unused]] int slot) {
#ifdef FLASHATTN_SM90_TIMELINE
  if (buf == nullptr || threadIdx.x % 128 != 0 || blockIdx.x >= kBlocks || round >= kRounds || slot >= kRoundSlots)
    return;
  uint64_t t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));  // ordered among the volatile asm (waits, barriers)
  buf[((size_t{blockIdx.x} * kRoles + threadIdx.x / 128) * kRounds + round) * kRoundSlots + slot] = t;
#endif
}
__device__ __forceinline__ constexpr int phase_slot(int phase, int event) {
  return phase < kPhases ? kHeader + kPerPhase * phase + event : kRoundSlots;
}

}  // namespace flashattn::detail::sm90::timeline
