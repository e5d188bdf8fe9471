# Run-time ISA dispatch: a source named *.avx512.cpp or *.avx2.cpp is compiled for that ISA only,
# and the code calling into it checks the CPU first (src/cpu/isa.hpp). Everything else is built
# for the baseline x86-64 so the library runs on any x86-64 CPU.
set(FLASHATTN_AVX512_FLAGS -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mfma -mf16c -mbmi2)
set(FLASHATTN_AVX2_FLAGS -mavx2 -mfma -mf16c -mbmi2)

function(flashattn_set_isa_flags)
  foreach(src IN LISTS ARGN)
    if(src MATCHES "\\.avx512\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${FLASHATTN_AVX512_FLAGS}")
    elseif(src MATCHES "\\.avx2\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${FLASHATTN_AVX2_FLAGS}")
    endif()
  endforeach()
endfunction()
