// bench/read_rate.hpp — the machine's memory read rate, measured beside what it bounds.
//
// A product that reads each weight once (one decoded token through a layer) can at best run at
// the rate a plain sequential read of the same bytes reaches in the same seconds; the benchmarks
// time that read in turn with the product (interleaved.hpp) and report the product's share of it.
#pragma once

#include <Eigen/Core>

namespace bd_bench {

/// Σ of n floats on every thread, each thread a contiguous share: a sequential read with no other
/// work, sixteen sums per thread so that no add waits on the one before.
inline float read_all(const float* p, Eigen::Index n) {
  constexpr Eigen::Index block = 4096;
  float total = 0;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) reduction(+ : total)
#endif
  for (Eigen::Index b = 0; b < n / block; ++b) {
    float acc[16] = {};
    const float* q = p + b * block;
    for (Eigen::Index i = 0; i < block; i += 16)
      for (int j = 0; j < 16; ++j) acc[j] += q[i + j];
    for (float a : acc) total += a;
  }
  for (Eigen::Index i = n / block * block; i < n; ++i) total += p[i];
  return total;
}

}  // namespace bd_bench
