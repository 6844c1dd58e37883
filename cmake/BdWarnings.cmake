# Warnings as errors on the project's own code (tests, benchmarks, examples, tools).
# Third-party headers (Eigen, Catch2, benchmark) come in as SYSTEM includes and are exempt.
function(bd_strict_warnings target)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror>)
    # CUDA sources: nvcc's own warnings and the host compiler's, both as errors.
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror>)
  endif()
endfunction()

# -march=native for programs run where they are built (benchmarks, examples); the library
# itself adds no architecture flags to its consumers.
option(BD_NATIVE "Compile bd's own programs with -march=native" ON)
function(bd_native target)
  if(BD_NATIVE AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE -march=native)
  endif()
endfunction()
