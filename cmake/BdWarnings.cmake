# Warnings as errors on the project's own code (tests, benchmarks, examples, tools), and the
# instruction set bd's own programs are compiled for.
# Third-party headers (Eigen, Catch2, benchmark) come in as SYSTEM includes and are exempt.
function(bd_strict_warnings target)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror>)
    # CUDA sources: nvcc's own warnings and the host compiler's, both as errors.
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror>)
  endif()
endfunction()

# bd's programs are built like a user's by default: no -march, so the kernels run on what they
# pick at run time (include/bd/kernel/cpu.hpp) and the figures are what a user gets.
# -DBD_MARCH=native (or x86-64-v4, x86-64-v3, ...) compiles them for that instruction set
# instead: Eigen's own products then use it too. tools/test.sh builds the SIMD-heavy targets
# with x86-64-v4 as well, so that a machine without AVX-512 still compiles the AVX-512 paths.
set(BD_MARCH "" CACHE STRING "-march for bd's own tests, benchmarks and examples (empty: the compiler's default)")

set(BD_MARCH_FLAGS "")
if(BD_MARCH AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  set(BD_MARCH_FLAGS -march=${BD_MARCH})
  # GCC 12's avx512fintrin.h writes undefined vectors as `__m512 __Y = __Y;`, which
  # -W(maybe-)uninitialized reports wherever Eigen's AVX-512 packet code is inlined into ours
  # (GCC PR 105593, fixed in GCC 13): thousands of false positives, none in bd. Silenced for
  # exactly that case — GCC < 13 with an -march that enables AVX-512.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    include(CheckCXXSourceCompiles)
    set(CMAKE_REQUIRED_FLAGS -march=${BD_MARCH})
    check_cxx_source_compiles("#ifndef __AVX512F__\n#error no AVX-512\n#endif\nint main() { return 0; }" BD_MARCH_HAS_AVX512)
    unset(CMAKE_REQUIRED_FLAGS)
    if(BD_MARCH_HAS_AVX512)
      list(APPEND BD_MARCH_FLAGS -Wno-maybe-uninitialized -Wno-uninitialized)
    endif()
  endif()
  message(STATUS "bd: tests, benchmarks and examples compiled with ${BD_MARCH_FLAGS}")
endif()

function(bd_march target)
  if(BD_MARCH_FLAGS)
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${BD_MARCH_FLAGS}>")
  endif()
endfunction()
