// bd/core/phase_times.hpp — where preparation spends its time.
//
// Elapsed (wall-clock) seconds, so that the phases add up to `total`. Factoring and scoring run
// as passes of their own; fitting, rounding and the error run fused per product (one head per
// thread, the product still in cache), and that pass's elapsed time is split between the
// three in proportion to the thread-seconds each took.
#pragma once

#include <chrono>
#include <mutex>

namespace bd {

struct PhaseTimes {
  double factor = 0;  ///< per product: Q = orth(U), VᵀV, row norms, sketch, rounding floor
  double score = 0;   ///< ranking candidate bases (window LUs, pivoting)
  double fit = 0;     ///< forming B = U_S·Vᵀ and fitting C, including the refit against round(B)
  double round = 0;   ///< rounding B and C to the storage type, checking they are finite (and
                      ///< ΔB = B̂ − B, when B is formed in float block by block)
  double error = 0;   ///< the exact error of the stored B and C

  double total() const { return factor + score + fit + round + error; }

  PhaseTimes& operator+=(const PhaseTimes& o) {
    factor += o.factor, score += o.score, fit += o.fit, round += o.round, error += o.error;
    return *this;
  }
};

namespace detail {

/// Seconds since the previous lap (or construction).
class Stopwatch {
public:
  double lap() {
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    return s;
  }

private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

/// Adds the seconds from its construction to its end to one phase:
///     { PhaseTimer timer(times.fit); ... }
class PhaseTimer {
public:
  explicit PhaseTimer(double& phase) : phase_(phase) {}
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;
  ~PhaseTimer() { phase_ += clock_.lap(); }

private:
  double& phase_;
  Stopwatch clock_;
};

/// The fused fit/round/error pass: threads add their thread-seconds; split() turns them into
/// shares of the pass's elapsed time.
class FitClock {
public:
  void add(const PhaseTimes& t) {
    std::lock_guard<std::mutex> lock(mutex_);
    busy_ += t;
  }
  /// Adds `elapsed` seconds to `out`'s fit, round and error in proportion to the thread-seconds.
  void split(double elapsed, PhaseTimes& out) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const double sum = busy_.fit + busy_.round + busy_.error;
    if (!(sum > 0)) {
      out.fit += elapsed;
      return;
    }
    out.fit += elapsed * busy_.fit / sum;
    out.round += elapsed * busy_.round / sum;
    out.error += elapsed * busy_.error / sum;
  }

private:
  mutable std::mutex mutex_;
  PhaseTimes busy_;
};

}  // namespace detail
}  // namespace bd
