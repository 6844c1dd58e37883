// bd/core/parallel.hpp — a parallel loop over independent items (heads, layers) that carries
// exceptions out of the OpenMP region. Without OpenMP it is a plain loop.
#pragma once

#include <exception>
#include <mutex>

#include <Eigen/Core>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace bd::detail {

/// Calls body(i) for i in [0, count), in parallel when OpenMP is on and `parallel` holds (in
/// order on the calling thread otherwise). The first exception thrown by any body is rethrown
/// once the loop is done; Eigen's own threading is nested off inside.
template <typename Body>
void parallel_for(Eigen::Index count, Body&& body, bool parallel = true) {
  std::exception_ptr failure;
  std::mutex failure_mutex;
  (void)parallel;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic) if (parallel && count > 1)
#endif
  for (Eigen::Index i = 0; i < count; ++i) {
    try {
      body(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace bd::detail

namespace bd {

/// Threads a parallel region would use (1 without OpenMP).
inline int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

}  // namespace bd
