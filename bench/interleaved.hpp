// bench/interleaved.hpp — several implementations of one computation timed in turn, within one
// benchmark, so that a comparison is read from the same seconds of the machine.
//
// These shared 2-core machines drift by ±10 % (and more) over seconds: two benchmarks run one
// after the other can see different machines, and a 5 % difference between them says nothing.
// Here every iteration runs each implementation once, each between its own clock reads, and the
// result is each one's median call. A slow spell slows all of them alike, so their ratios hold
// where their times do not.
//
// The order changes every iteration so that each call follows every other call equally often: a
// call is timed in the wake of the one before it — OpenBLAS's worker threads spin for a while
// after a call returns, on the same two cores, and a product leaves its operands in the caches —
// and a plain rotation of three calls puts the same one before a given call two times in three
// (BDLinear followed OpenBLAS's call in 2 of 3 iterations, and ran a median 8 % slower after it
// than after its twin; docs/benchmarks.md). The orders below, found by exhaustive search, make
// every ordered pair of different calls adjacent exactly once per cycle, the cycle's wrap
// included; time_interleaved checks that before it times anything.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

namespace bd_bench {

/// The iterations' orders of n calls, one cycle: consecutive orders concatenated (and the last
/// followed by the first) put each ordered pair (a, b), a ≠ b, side by side exactly once. For more
/// than five calls, a rotation (each call then follows one other more often than the rest).
inline std::vector<std::vector<std::size_t>> balanced_orders(std::size_t n) {
  switch (n) {
    case 0: return {};
    case 1: return {{0}};
    case 2: return {{0, 1}};
    case 3: return {{0, 1, 2}, {0, 2, 1}};
    case 4: return {{0, 1, 2, 3}, {0, 2, 1, 3}, {1, 0, 3, 2}};
    case 5: return {{0, 1, 2, 3, 4}, {0, 2, 1, 4, 3}, {0, 3, 2, 4, 1}, {3, 1, 0, 4, 2}};
    default: {
      std::vector<std::vector<std::size_t>> orders(n, std::vector<std::size_t>(n));
      for (std::size_t first = 0; first < n; ++first)
        for (std::size_t i = 0; i < n; ++i) orders[first][i] = (first + i) % n;
      return orders;
    }
  }
}

/// How long OpenBLAS's worker threads keep polling after a call returns: its pthreads server
/// (Debian's libopenblas0-pthread) spins for 2^28 TSC cycles, 0.13 s at this machine's 2.1 GHz
/// TSC, before it sleeps — on the same cores as whatever runs next. bd's calls timed right after
/// an OpenBLAS call ran up to 18 % slower than after another bd call (a median 8–9 % over six
/// runs), and as fast once 0.3 s had passed (docs/benchmarks.md).
inline constexpr double kOpenBlasSettleSeconds = 0.3;

/// Whether consecutive orders (the last followed by the first) put every ordered pair of
/// different calls side by side equally often.
inline bool is_balanced(const std::vector<std::vector<std::size_t>>& orders, std::size_t n) {
  std::vector<std::size_t> sequence;
  for (const auto& order : orders) sequence.insert(sequence.end(), order.begin(), order.end());
  std::vector<std::size_t> pairs(n * n, 0);
  for (std::size_t i = 0; i < sequence.size(); ++i)
    ++pairs[sequence[(i + sequence.size() - 1) % sequence.size()] * n + sequence[i]];
  for (std::size_t a = 0; a < n; ++a)
    for (std::size_t b = 0; b < n; ++b)
      if (a != b && pairs[a * n + b] != pairs[1]) return false;
  return true;
}

/// Runs each of `calls` once untimed, then once per iteration of `state`, in the orders of
/// balanced_orders in turn; returns each call's median time in seconds, in the order of `calls`. settle[k], where given,
/// is how long to wait after call k with the clock stopped (kOpenBlasSettleSeconds after an
/// OpenBLAS call), so that it leaves no thread spinning into the next call's time. `all_seconds`,
/// where given, receives every call's times, iteration by iteration (for paired_ratio).
inline std::vector<double> time_interleaved(benchmark::State& state, const std::vector<std::function<void()>>& calls,
                                            const std::vector<double>& settle = {},
                                            std::vector<std::vector<double>>* all_seconds = nullptr) {
  const std::size_t n = calls.size();
  const std::vector<std::vector<std::size_t>> orders = balanced_orders(n);
  if (n >= 2 && n <= 5 && !is_balanced(orders, n)) {
    state.SkipWithError("interleaved.hpp: balanced_orders is not balanced");
    return std::vector<double>(n, 0.0);
  }
  // One untimed round first. A benchmark's first call of each kind touches its output's pages
  // for the first time and grows its workspace, and where an iteration outlasts min_time the
  // first iteration is the only one: the first call of its order paid for all of that, on these
  // VMs as much as the call itself (docs/benchmarks.md, "The interleaved benchmarks' first round").
  for (std::size_t k = 0; k < n; ++k) {
    calls[k]();
    if (k < settle.size() && settle[k] > 0) std::this_thread::sleep_for(std::chrono::duration<double>(settle[k]));
  }
  std::vector<std::vector<double>> seconds(n);
  std::size_t iteration = 0;
  for (auto _ : state) {
    for (const std::size_t k : orders[iteration++ % orders.size()]) {
      const auto start = std::chrono::steady_clock::now();
      calls[k]();
      seconds[k].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      if (k < settle.size() && settle[k] > 0) {
        state.PauseTiming();
        std::this_thread::sleep_for(std::chrono::duration<double>(settle[k]));
        state.ResumeTiming();
      }
    }
  }
  if (all_seconds) *all_seconds = seconds;
  std::vector<double> medians(n, 0.0);
  for (std::size_t k = 0; k < n; ++k) {
    auto& v = seconds[k];
    if (v.empty()) continue;
    std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
    medians[k] = v[v.size() / 2];
  }
  return medians;
}

/// The median over iterations of a[i] / b[i]: two calls' ratio from the seconds they ran side by
/// side in each iteration (of time_interleaved's `all_seconds`), so that a drift slower than one
/// iteration cancels in each ratio rather than only in the medians' — what a ratio near 1 between
/// calls of a second or more needs (a chunk's prefill at 16k context: the two layers differ by
/// 0.2 % of the work while single calls moved by 16–28 %).
inline double paired_ratio(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) r.push_back(a[i] / b[i]);
  if (r.empty()) return 0.0;
  std::nth_element(r.begin(), r.begin() + std::ptrdiff_t(r.size() / 2), r.end());
  return r[r.size() / 2];
}

/// Each iteration's faster of two calls (a BD layer against the faster of its twins, paired).
inline std::vector<double> faster_of(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> out;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) out.push_back(std::min(a[i], b[i]));
  return out;
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
