#!/usr/bin/env bash
# One run on a machine with an NVIDIA GPU (H100/H200): the CUDA tests, compute-sanitizer's
# memcheck, synccheck and racecheck, and the benchmark sweep, every log kept under $OUT (default
# ./gpu-logs). Uses the build in $BUILD (default build-gpu) when it is there — built elsewhere with
#   cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real -DBD_WITH_OPENMP=OFF \
#         -DBD_BUILD_EXAMPLES=OFF -DBD_BUILD_TOOLS=OFF
#   cmake --build build-gpu --target bd_cuda_tests bd_cuda_host_tests bd_cuda_layout_tests bd_cuda_bench
# (and libbenchmark's shared library copied into build-gpu/lib) — and configures and builds it
# otherwise. Each step has its own time limit, so a hung kernel costs that step, not the run; the
# last lines printed are the summary.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}
BUILD=${BUILD:-build-gpu}
LOGS=$OUT/logs  # tarred into $OUT/logs.tgz at the end (few files travel back from a lent machine)
mkdir -p "$LOGS"
summary=()
step() {  # step NAME SECONDS COMMAND...: runs, logs to $OUT/NAME.log, records the outcome
  local name=$1 limit=$2
  shift 2
  if ((SECONDS + 30 > ${BUDGET:-100000})); then  # BUDGET: seconds the whole run may take
    summary+=("$(printf '%-28s skipped (budget)' "$name")")
    return 0
  fi
  ((SECONDS + limit > ${BUDGET:-100000})) && limit=$((BUDGET - SECONDS))
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-28s rc=%-4s %4ss' "$name" "$rc" $((SECONDS - t0)))")
  echo "== $name: rc=$rc ($((SECONDS - t0)) s)"
  tail -n 25 "$LOGS/$name.log"
  return $rc
}

{
  nvidia-smi
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv
  nvcc --version 2>/dev/null | tail -n 2
  command -v compute-sanitizer
} >"$LOGS/device.log" 2>&1
head -n 20 "$LOGS/device.log"

# cuBLAS and libbenchmark where the loader finds them.
for lib in libcublasLt.so.13 libcublas.so.13; do
  dir=$(dirname "$(find / -xdev -name "$lib" 2>/dev/null | head -n 1)" 2>/dev/null)
  [[ -n "$dir" && "$dir" != . ]] && export LD_LIBRARY_PATH="$dir:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH="$PWD/$BUILD/lib:${LD_LIBRARY_PATH:-}"

if [[ ! -x "$BUILD/tests/bd_cuda_tests" ]] || ! "$BUILD/tests/bd_cuda_tests" --has-device; then
  echo "== building here (no usable carried build)"
  step configure 300 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real -DBD_WITH_OPENMP=OFF \
    -DBD_BUILD_EXAMPLES=OFF -DBD_BUILD_TOOLS=OFF
  step build 600 cmake --build "$BUILD" -j"$(nproc)" --target bd_cuda_tests bd_cuda_host_tests bd_cuda_layout_tests bd_cuda_bench
fi
tests=$BUILD/tests/bd_cuda_tests
bench=$BUILD/bench/bd_cuda_bench

step cuda_tests 240 "$tests"
step host_tests 60 "$BUILD/tests/bd_cuda_host_tests"

# The sweep, with the SM clock sampled beside it.
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu --format=csv -lms 250 \
  >"$OUT/clocks.csv" 2>&1 &
sampler=$!
# BENCH_RUNS whole runs (default 1): how far the figures move between runs on this card.
for ((run = 1; run <= ${BENCH_RUNS:-1}; ++run)); do
  step "bench_best_$run" 200 "$bench" --benchmark_filter='cuda_kproj_best' --benchmark_out="$LOGS/cuda_kproj_best_$run.json" \
    --benchmark_out_format=json
done
kill "$sampler" 2>/dev/null

# Nsight Compute on one round of the L = 16384 half comparison: the plan's choice and every fixed
# configuration (plan() launches its 6 candidates 7 times each and the warm-up 13 before that
# round), for where the time goes (tensor pipe, L2, the consumers' stall reasons). NCU=1 asks for it.
if [[ -n "${NCU:-}" ]] && command -v ncu >/dev/null; then
  step ncu 120 ncu --clock-control none --kernel-name regex:bd_projection_sm90 --launch-skip 55 --launch-count 13 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    "$bench" --benchmark_filter='cuda_kproj_best/half/16384'
fi
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [[ -x "$sanitizer" ]]; then
  # racecheck reports hazards inside cuBLAS's own nvjet_sm90 kernels, which bd can neither see into
  # nor fix: tools/racecheck_verdict.sh fails on any hazard the summary counts beyond those.
  step racecheck 300 bash -c '"$1" --tool racecheck "$2" --sanitizer; rc=$?
    exit $rc' sh "$sanitizer" "$tests"
  if verdict=$(sh tools/racecheck_verdict.sh "$LOGS/racecheck.log"); then
    summary+=("$verdict")
  else
    summary+=("$verdict (FAILED)")
  fi
  step memcheck 240 "$sanitizer" --tool memcheck --error-exitcode 9 "$tests" --sanitizer
  step synccheck 240 "$sanitizer" --tool synccheck --error-exitcode 9 "$tests" --sanitizer
else
  summary+=("compute-sanitizer not found")
fi
[[ -n "${SWEEP:-}" ]] && step bench_sweep 240 "$bench" --benchmark_filter='cuda_kproj(_bf16)?/(cublas_dense|bd_cublaslt|bd_hopper)/' \
  --benchmark_min_time=0.1 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_out="$OUT/cuda_kproj_sweep.json" --benchmark_out_format=json

echo "== summary"
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -r "$LOGS"
