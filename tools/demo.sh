#!/usr/bin/env bash
# Builds bd's main demo and runs it on its built-in default: every attention layer of a
# synthetic DeepSeek-V2-Lite model, decomposed with each basis strategy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh demo
cmake -S . -B build-demo -DCMAKE_BUILD_TYPE=Release -DBD_BUILD_TESTS=OFF -DBD_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build build-demo --target deepseek_demo -j"$(nproc)"
./build-demo/examples/deepseek_demo "$@"
