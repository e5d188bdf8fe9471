// Which Hopper features the current compilation pass may emit. The library compiles every file for
// sm_80 and sm_90a, so each sm90 primitive keeps its declaration visible in every pass (kernels
// that call it must still parse) and emits its PTX only where the target has it:
//   FLASHATTN_SM90_DEVICE   sm_90 and later: mbarrier transaction counts, TMA (cp.async.bulk.tensor),
//                           fence.proxy.async, named barriers with counts.
//   FLASHATTN_SM90A_DEVICE  the arch-specific sm_90a target: wgmma, setmaxnreg.
// In other passes the bodies trap: reaching one means a kernel was selected for the wrong GPU.
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FLASHATTN_SM90_DEVICE 1
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASHATTN_SM90A_DEVICE 1
#endif
