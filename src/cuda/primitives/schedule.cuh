// Ordering that ptxas must keep: a value it cannot see through, and the end of a basic block.
#pragma once

namespace flashattn::cuda {

// x, as a value the compiler cannot see through: what is computed from it stays after this point
// (the epilogue's addresses would otherwise be hoisted out of the item loop and kept, or spilled,
// across the main loop).
__device__ __forceinline__ int opaque(int x) {
  asm volatile("" : "+r"(x)::"memory");
  return x;
}

// Ends ptxas's basic block here: a branch that it cannot remove, to a trap never reached (x is never
// -1). ptxas schedules a wgmma wait, an instruction without operands, as early as its basic block
// lets it, ahead of independent work written before it (even in straight-line code); a wait
// written after this stays after that work. Independent work written before may still sink below
// the branch where ptxas schedules the branch early (seen with a softmax's exponentials, docs/perf.md
// 2026-12-04, session 27); a loop's back edge keeps them apart.
__device__ __forceinline__ void end_basic_block(int x) {
  if (opaque(x) == -1) __trap();
}

}  // namespace flashattn::cuda
