// Inline code that the ISA-specific translation units (*.avx512.cpp, *.avx2.cpp, compiled with
// those -m flags: cmake/FlashattnIsa.cmake) share with the baseline build must not share its
// symbols: the linker keeps one copy of each inline function, and an AVX-512 copy reached from the
// baseline path faults on CPUs without AVX-512. Headers with such code open their namespace as
// `namespace flashattn::detail::FLASHATTN_ISA_NS {`, an inline namespace named after the ISA the
// translation unit is built for; callers see no difference.
#pragma once

#if defined(FLASHATTN_ISA_AVX512)
#define FLASHATTN_ISA_NS inline isa_avx512
#elif defined(FLASHATTN_ISA_AVX2)
#define FLASHATTN_ISA_NS inline isa_avx2
#else
#define FLASHATTN_ISA_NS inline isa_base
#endif
