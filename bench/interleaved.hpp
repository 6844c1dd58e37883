// bench/interleaved.hpp — several implementations of one computation timed in turn, within one
// benchmark, so that a comparison is read from the same seconds of the machine.
//
// These shared 2-core machines drift by ±10 % (and more) over seconds: two benchmarks run one
// after the other can see different machines, and a 5 % difference between them says nothing.
// Here every iteration runs each implementation once, each between its own clock reads, starting
// with a different one each iteration (a rotation), and the result is each one's median call.
// A slow spell slows all of them alike, so their ratios hold where their times do not.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <vector>

namespace bd_bench {

/// Runs each of `calls` once per iteration of `state`, in an order that rotates every iteration;
/// returns each call's median time in seconds, in the order of `calls`.
inline std::vector<double> time_interleaved(benchmark::State& state, const std::vector<std::function<void()>>& calls) {
  const std::size_t n = calls.size();
  std::vector<std::vector<double>> seconds(n);
  std::size_t first = 0;
  for (auto _ : state) {
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t k = (first + i) % n;
      const auto start = std::chrono::steady_clock::now();
      calls[k]();
      seconds[k].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    first = (first + 1) % n;
  }
  std::vector<double> medians(n, 0.0);
  for (std::size_t k = 0; k < n; ++k) {
    auto& v = seconds[k];
    if (v.empty()) continue;
    std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
    medians[k] = v[v.size() / 2];
  }
  return medians;
}

/// The counters of a dense/BD pair timed by time_interleaved: each one's median in ms, the
/// speedup (dense over BD), the FLOP ratio it is read against and its share of it.
inline void pair_counters(benchmark::State& state, double dense_seconds, double bd_seconds, double theory) {
  state.counters["mha_ms"] = dense_seconds * 1e3;
  state.counters["bda_ms"] = bd_seconds * 1e3;
  state.counters["speedup"] = dense_seconds / bd_seconds;
  state.counters["theoretical_ratio"] = theory;
  state.counters["share_of_theory"] = dense_seconds / bd_seconds / theory;
}

}  // namespace bd_bench
