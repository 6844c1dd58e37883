#!/usr/bin/env bash
# Installs with apt-get the Debian 12 packages bd needs for one purpose, only when missing.
#   tools/install-deps.sh demo   compiler, CMake, Eigen, nlohmann-json
#   tools/install-deps.sh test   + Ninja (tools/test.sh's builds), Catch2, Google Benchmark, nlohmann-json,
#                                OpenBLAS, clang and its OpenMP (the header-only, sanitizer and fuzzing builds),
#                                PyTorch (libtorch-dev, python3-torch) and pytest for
#                                the PyTorch extension
#   tools/install-deps.sh bench  what `test` needs + python3-matplotlib (bench/report's plot), BLIS
#                                (a second dense baseline in bd_bench) and oneDNN (the bf16 anchor)
#   tools/install-deps.sh train  what `test` needs + the King James Bible (bible-kjv, bible-kjv-text:
#                                train_lm's default corpus) and python3-matplotlib (the sweep's plot)
set -euo pipefail

purpose=${1:-test}
packages=(g++ make cmake libeigen3-dev)
case "$purpose" in
  demo) packages+=(nlohmann-json3-dev) ;;
  test) packages+=(ninja-build catch2 libbenchmark-dev nlohmann-json3-dev libopenblas-dev clang libclang-rt-14-dev libomp-dev python3
                   libtorch-dev python3-torch python3-pytest) ;;
  bench) packages+=(ninja-build catch2 libbenchmark-dev nlohmann-json3-dev libopenblas-dev clang libclang-rt-14-dev libomp-dev python3
                    libtorch-dev python3-torch python3-pytest
                    python3-matplotlib libblis-openmp-dev libdnnl-dev) ;;
  train) packages+=(ninja-build catch2 libbenchmark-dev nlohmann-json3-dev libopenblas-dev clang libclang-rt-14-dev libomp-dev python3
                    libtorch-dev python3-torch python3-pytest
                    python3-matplotlib bible-kjv bible-kjv-text) ;;
  *) echo "usage: $0 demo|test|bench|train" >&2; exit 2 ;;
esac

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "bd: installing ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  echo "bd: run as root (or install these packages): ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# A fresh machine has no package lists: update before installing.
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
