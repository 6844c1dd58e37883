#!/usr/bin/env bash
# Compile time and compiler memory of a user's program, header-only, as a user builds it: g++
# -std=c++17 -O3 -DNDEBUG -fopenmp, no -march, one translation unit at a time, each under
# /usr/bin/time -v. Three programs: Eigen's heavy machinery alone (eigen_baseline.cpp, the
# yardstick), the README's example (examples/quickstart.cpp: one decompose_product<Eigen::half>)
# and an attention program (examples/attention_layer.cpp: BDAttention<float>::prepare, forward
# and cached decoding), each also as a bd::compiled user compiles it. Usage:
# bench/compile_time/measure.sh [repetitions, default 3]; prints, for each, the median seconds,
# the median of its ratios to the baseline's time in the same round, and the peak RSS; and the
# CPU it ran on. The programs are compiled in rounds (each program once per round), so that
# this machine's drift — ±10 % from one minute to the next on a shared VM — falls on the
# baseline and the programs alike instead of on whichever ran last.
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-3}
cxx=${CXX:-g++}
eigen=$(pkg-config --cflags eigen3 2>/dev/null || echo -I/usr/include/eigen3)
flags="-std=c++17 -O3 -DNDEBUG -fopenmp $eigen -Iinclude"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores; $($cxx --version | head -n 1)"
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
# Each program header-only, then the two bd programs as a bd::compiled user compiles them
# (BD_COMPILED_LIB: bd's heavy instantiations declared extern, taken from the library at link).
entries=(bench/compile_time/eigen_baseline.cpp examples/quickstart.cpp examples/attention_layer.cpp
         examples/quickstart.cpp:compiled examples/attention_layer.cpp:compiled)
declare -A times rss ratios
for ((r = 0; r < reps; ++r)); do
  baseline=""
  for entry in "${entries[@]}"; do
    src=${entry%%:*} extra=""
    if [[ $entry == *:compiled ]]; then extra=-DBD_COMPILED_LIB; fi
    /usr/bin/time -v -o "$out/time" $cxx $flags $extra -c "$src" -o "$out/a.o"
    t=$(awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, t, ":"); s = 0; for (i = 1; i <= n; ++i) s = s * 60 + t[i]; print s}' "$out/time")
    times[$entry]+="$t "
    rss[$entry]+="$(awk -F': ' '/Maximum resident set size/ {printf "%.0f", $2 / 1024}' "$out/time") "
    baseline=${baseline:-$t}
    ratios[$entry]+="$(awk -v a="$t" -v b="$baseline" 'BEGIN {printf "%.3f", a / b}') "
  done
  # Each round as it ends (seconds, in the order of the table below), so a drift shows.
  line="round $((r + 1)):"
  for entry in "${entries[@]}"; do line+=" $(echo "${times[$entry]}" | awk '{print $NF}')"; done
  echo "$line"
done
printf '%-46s %10s %14s %14s\n' program "seconds" "× baseline" "peak RSS MB"
for entry in "${entries[@]}"; do
  label=${entry%%:*}
  [[ $entry == *:compiled ]] && label="$label (bd::compiled)"
  # shellcheck disable=SC2086  # the lists are space-separated numbers
  printf '%-46s %10s %14s %14s\n' "$label" "$(median ${times[$entry]})" "$(median ${ratios[$entry]})" "$(median ${rss[$entry]})"
done
