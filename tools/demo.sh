#!/usr/bin/env bash
# Builds bd-convert and runs its built-in demo: a synthetic DeepSeek-V2-Lite attention stack
# (27 layers of MLA with decoupled RoPE) converted to BD (qkvo, f16) and verified in memory.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh demo
cmake -S . -B build-demo -DCMAKE_BUILD_TYPE=Release -DBD_BUILD_TESTS=OFF -DBD_BUILD_BENCHMARKS=OFF \
  -DBD_BUILD_EXAMPLES=OFF >/dev/null
cmake --build build-demo --target bd-convert -j"$(nproc)"
./build-demo/tools/bd-convert --demo "$@"
