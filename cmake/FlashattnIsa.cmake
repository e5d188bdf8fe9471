# Run-time ISA dispatch: a source named *.avx512.cpp or *.avx2.cpp is compiled for that ISA only,
# and the code calling into it checks the CPU first (src/cpu/isa.hpp). Everything else is built
# for the baseline x86-64 so the library runs on any x86-64 CPU. The FLASHATTN_ISA_* define keeps
# the inline code those files share with the baseline in an ISA-named namespace
# (src/core/isa_namespace.hpp), so the linker cannot hand the baseline an AVX-512 copy.
set(FLASHATTN_AVX512_FLAGS -DFLASHATTN_ISA_AVX512 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mfma -mf16c -mbmi2)
set(FLASHATTN_AVX2_FLAGS -DFLASHATTN_ISA_AVX2 -mavx2 -mfma -mf16c -mbmi2)

# Unoptimised builds emit small library templates (std::min, std::fill) out of line in every object;
# ISA objects are optimised even in Debug builds so that they inline them instead
# (tests/core/check_isa_symbols.sh checks the archive).
list(APPEND FLASHATTN_AVX512_FLAGS $<$<CONFIG:Debug>:-O2>)
list(APPEND FLASHATTN_AVX2_FLAGS $<$<CONFIG:Debug>:-O2>)

function(flashattn_set_isa_flags)
  foreach(src IN LISTS ARGN)
    if(src MATCHES "\\.avx512\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${FLASHATTN_AVX512_FLAGS}")
    elseif(src MATCHES "\\.avx2\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${FLASHATTN_AVX2_FLAGS}")
    endif()
  endforeach()
endfunction()
