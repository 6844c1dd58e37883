#!/bin/sh
# The verdict on a compute-sanitizer racecheck log: passes only when every hazard the run's
# summary counts ("RACECHECK SUMMARY: N hazards displayed") is one reported inside cuBLAS's own
# nvjet_sm90 kernels, which bd can neither see into nor fix (tests/CMakeLists.txt says more). A
# log without the summary (a run cut short) fails. Usage: racecheck_verdict.sh LOG
log=$1
total=$(sed -n 's/.*RACECHECK SUMMARY: \([0-9][0-9]*\) hazard.*/\1/p' "$log" | tail -n 1)
if [ -z "$total" ]; then
  echo "racecheck: no summary line in $log: the run did not finish"
  exit 1
fi
nvjet=$(grep -c 'Race reported between [A-Za-z]* access at nvjet_sm90_' "$log")
if [ "$total" -ne "$nvjet" ]; then
  echo "racecheck: $total hazards, $nvjet of them inside cuBLAS's nvjet kernels: a hazard elsewhere"
  exit 1
fi
echo "racecheck: $total hazards, all inside cuBLAS's nvjet kernels"
