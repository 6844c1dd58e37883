#!/usr/bin/env bash
# Installs what is missing, then builds and runs bd's whole test suite with ctest:
#   1. Release build of everything (tests, examples, benchmarks, tools, consumers, the PyTorch extension
#      and its pytest suite where Torch is installed), -Wall -Wextra -Werror,
#      with no -march: the x86-64 baseline a user's program gets (the kernels choose AVX-512, AVX2
#      or portable code when they run, and the kernel tests force each path the CPU has);
#   2. the route the README shows first, header-only (bd::bd, no bd::compiled), with clang and
#      -march=x86-64-v4: the kernel tests and three examples (quickstart: decomposition;
#      attention_layer: the layers and flash attention; deepseek_demo: every public header through
#      bd/bd.hpp), so what the compiled mode's extern templates would hide, and what only clang
#      reports, fails here. x86-64-v4 makes Eigen and the compiler use AVX-512 throughout: compiled
#      on every machine, so one without AVX-512 still catches what breaks there; the kernel tests
#      run only where the CPU has AVX-512. (The nn tests header-only cost 90-100 s a file under the
#      sanitizers, ~15 minutes: the examples are the header-only check of nn and io.)
#   3. the tests of the code that does its own pointer arithmetic — the packed GEMM kernel (every
#      path the CPU has), the operators on it (nn) and the safetensors reader/writer (io) — again
#      under AddressSanitizer + UndefinedBehaviorSanitizer, compiled by clang (two thirds of g++'s
#      time on these files; step 1 is g++'s) at -O1 -g1 (line tables only). The decomposition tests
#      (core) are Eigen expressions end to end and the real-model tests repeat nn's paths at scale:
#      step 1 only;
#   4. the safetensors parser under libFuzzer (clang) for BD_FUZZ_SECONDS (60) from the seed corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh test
jobs=$(nproc)
# Ninja where it is installed (install-deps.sh test installs it): it starts a target's objects while
# the libraries it links are still compiling, and keeps both cores busy where make's per-target
# order left one idle. A build folder keeps the generator it was configured with.
configure() {
  local dir=$2
  if [[ ! -f $dir/CMakeCache.txt ]] && command -v ninja > /dev/null; then
    cmake -G Ninja "$@"
  else
    cmake "$@"
  fi
}
# "bd: [N s, M.m min] step K (…) done": each step's end on the clock from the start.
done_step() { echo "bd: [${SECONDS} s, $((SECONDS / 60)).$((SECONDS % 60 * 10 / 60)) min] step $1 done"; }

configure -B build -S . -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"
done_step "1 (Release build and ctest)"

configure -B build-v4 -S . -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Release -DBD_MARCH=x86-64-v4 \
  -DBD_BUILD_COMPILED=OFF -DBD_WITH_CUDA=OFF -DBD_BUILD_TOOLS=OFF -DBD_BUILD_BENCHMARKS=OFF -DBD_WITH_TORCH=OFF
cmake --build build-v4 -j"$jobs" --target bd_kernel_tests quickstart attention_layer deepseek_demo
if grep -qw avx512f /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo && grep -qw avx512dq /proc/cpuinfo \
   && grep -qw avx512vl /proc/cpuinfo; then
  ctest --test-dir build-v4 --output-on-failure -j"$jobs" -L kernel
else
  echo "bd: this CPU lacks AVX-512: the x86-64-v4 build was compiled, not run"
fi
done_step "2 (header-only clang x86-64-v4 kernel tests and examples)"

sanitize="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
configure -B build-asan -S . -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBD_BUILD_BENCHMARKS=OFF -DBD_BUILD_EXAMPLES=OFF -DBD_WITH_CUDA=OFF \
  -DBD_BUILD_TOOLS=OFF -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCMAKE_CXX_FLAGS="$sanitize" \
  -DCMAKE_EXE_LINKER_FLAGS="$sanitize"
cmake --build build-asan -j"$jobs" --target bd_sanitized_tests
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs" -L "kernel|nn|io"
done_step "3 (sanitizers)"

configure -B build-fuzz -S . -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBD_BUILD_FUZZERS=ON \
  -DBD_BUILD_TESTS=OFF -DBD_BUILD_BENCHMARKS=OFF -DBD_BUILD_EXAMPLES=OFF -DBD_BUILD_TOOLS=OFF -DBD_WITH_OPENMP=OFF -DBD_WITH_CUDA=OFF \
  -DBD_INSTALL=OFF
cmake --build build-fuzz -j"$jobs" --target fuzz_safetensors
corpus=$(mktemp -d)
./build-fuzz/tests/fuzz/fuzz_safetensors -max_total_time="${BD_FUZZ_SECONDS:-60}" -print_final_stats=1 \
  "$corpus" tests/fuzz/seeds 2>&1 | tail -n 4
rm -rf "$corpus"
echo "bd: fuzzing found no crash"
done_step "4 (fuzzing)"
