#!/usr/bin/env bash
# Builds the generate example and bd-convert, then runs both: first a real trained model
# (stories260K, shipped in examples/models) writing a story, dense and BD side by side; then
# bd-convert's built-in demo, a synthetic DeepSeek-V2-Lite attention stack (27 layers of MLA with
# decoupled RoPE) converted to BD (qkvo, f16) and verified in memory. Arguments go to the latter.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh demo
cmake -S . -B build-demo -DCMAKE_BUILD_TYPE=Release -DBD_BUILD_TESTS=OFF -DBD_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build build-demo --target generate bd-convert -j"$(nproc)"
# stories260K has 8 query heads on 4 key/value heads: BD on VO chooses one window per key/value
# head, so V' and the cache keep the model's 4 heads.
./build-demo/examples/generate --tokens 100
echo
./build-demo/tools/bd-convert --demo "$@"
