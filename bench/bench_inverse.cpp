// inverse/<kind>/<type>/<impl>/<n>: the r×r inverses preparation computes (r = d_h, 64…192),
// one thread, as preparation runs them (one product per thread).
//
//   lower  L⁻¹ of a lower-triangular L     bd: kernel::lower_inverse_into (row-wise substitution
//                                          on the CPU's vectors); eigen: triangularView's
//                                          solveInPlace against the identity; openblas: ?trtri
//   lu     A⁻¹ from an existing P·A = L·U  bd: kernel::SmallLU::inverse_into (U⁻¹·L⁻¹·P);
//                                          eigen: PartialPivLU::inverse(); openblas: ?getri
//
// Counter: GFLOP/s at the textbook counts, n³/3 for a triangular inverse and 4n³/3 for ?getri's
// work after the LU (the same count for every implementation, so the rates compare as times do).
#include <benchmark/benchmark.h>

#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Core>
#include <Eigen/LU>

#include <bd/base/workspace.hpp>
#include <bd/kernel/inverse.hpp>
#include <bd/kernel/small_lu.hpp>

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef BD_HAVE_OPENBLAS
#include <cblas.h>
extern "C" {
void strtri_(const char* uplo, const char* diag, const int* n, float* a, const int* lda, int* info);
void dtrtri_(const char* uplo, const char* diag, const int* n, double* a, const int* lda, int* info);
void sgetrf_(const int* m, const int* n, float* a, const int* lda, int* ipiv, int* info);
void dgetrf_(const int* m, const int* n, double* a, const int* lda, int* ipiv, int* info);
void sgetri_(const int* n, float* a, const int* lda, const int* ipiv, float* work, const int* lwork, int* info);
void dgetri_(const int* n, double* a, const int* lda, const int* ipiv, double* work, const int* lwork, int* info);
}
#endif

namespace {

using bd::Index;

template <typename T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;

/// One thread for bd, Eigen and OpenBLAS while a benchmark runs; the previous counts after.
class OneThread {
 public:
  OneThread() {
#ifdef _OPENMP
    omp_threads_ = omp_get_max_threads();
    omp_set_num_threads(1);
#endif
#ifdef BD_HAVE_OPENBLAS
    blas_threads_ = openblas_get_num_threads();
    openblas_set_num_threads(1);
#endif
  }
  ~OneThread() {
#ifdef _OPENMP
    omp_set_num_threads(omp_threads_);
#endif
#ifdef BD_HAVE_OPENBLAS
    openblas_set_num_threads(blas_threads_);
#endif
  }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  [[maybe_unused]] int omp_threads_ = 1, blas_threads_ = 1;
};

/// A well-conditioned n×n matrix, like a basis block of a preparation (diagonally dominant).
template <typename T>
Matrix<T> test_matrix(Index n) {
  Matrix<T> a = Matrix<T>::Random(n, n);
  a.diagonal().array() += T(n) / 4;
  return a;
}

template <typename T>
void lower(benchmark::State& state, const std::string& impl) {
  const OneThread one;
  const Index n = state.range(0);
  const Matrix<T> L = test_matrix<T>(n).template triangularView<Eigen::Lower>();
  Matrix<T> out(n, n);
  bd::Workspace ws;
  for (auto _ : state) {
    if (impl == "bd") {
      bd::kernel::lower_inverse_into(L, out, ws);
    } else if (impl == "eigen") {
      out.setIdentity();
      L.template triangularView<Eigen::Lower>().solveInPlace(out);
    } else {
#ifdef BD_HAVE_OPENBLAS
      out = L;
      const int size = static_cast<int>(n);
      int info = 0;
      if constexpr (std::is_same_v<T, float>) strtri_("L", "N", &size, out.data(), &size, &info);
      else dtrtri_("L", "N", &size, out.data(), &size, &info);
      if (info != 0) state.SkipWithError("?trtri failed");
#endif
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(double(n) * double(n) * double(n) / 3 * double(state.iterations()) * 1e-9, benchmark::Counter::kIsRate);
}

template <typename T>
void lu(benchmark::State& state, const std::string& impl) {
  const OneThread one;
  const Index n = state.range(0);
  const Matrix<T> A = test_matrix<T>(n);
  Matrix<T> out(n, n);
  bd::Workspace ws;
  bd::kernel::SmallLU<T> small(A);
  const Eigen::PartialPivLU<Matrix<T>> eigen(A);
#ifdef BD_HAVE_OPENBLAS
  const int size = static_cast<int>(n), lwork = static_cast<int>(64 * n);
  Matrix<T> factors = A;
  std::vector<int> ipiv(static_cast<std::size_t>(n));
  std::vector<T> work(static_cast<std::size_t>(lwork));
  int info = 0;
  if constexpr (std::is_same_v<T, float>) sgetrf_(&size, &size, factors.data(), &size, ipiv.data(), &info);
  else dgetrf_(&size, &size, factors.data(), &size, ipiv.data(), &info);
#endif
  for (auto _ : state) {
    if (impl == "bd") {
      small.inverse_into(out, ws);
    } else if (impl == "eigen") {
      out = eigen.inverse();
    } else {
#ifdef BD_HAVE_OPENBLAS
      out = factors;
      if constexpr (std::is_same_v<T, float>) sgetri_(&size, out.data(), &size, ipiv.data(), work.data(), &lwork, &info);
      else dgetri_(&size, out.data(), &size, ipiv.data(), work.data(), &lwork, &info);
      if (info != 0) state.SkipWithError("?getri failed");
#endif
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(4 * double(n) * double(n) * double(n) / 3 * double(state.iterations()) * 1e-9,
                                                 benchmark::Counter::kIsRate);
}

template <typename T>
void register_type(const char* type) {
  std::vector<std::string> impls = {"bd", "eigen"};
#ifdef BD_HAVE_OPENBLAS
  impls.push_back("openblas");
#endif
  for (const std::string& impl : impls) {
    benchmark::RegisterBenchmark(("inverse/lower/" + std::string(type) + "/" + impl).c_str(),
                                 [impl](benchmark::State& s) { lower<T>(s, impl); })
        ->Arg(64)->Arg(128)->Arg(192);
    benchmark::RegisterBenchmark(("inverse/lu/" + std::string(type) + "/" + impl).c_str(),
                                 [impl](benchmark::State& s) { lu<T>(s, impl); })
        ->Arg(64)->Arg(128)->Arg(192);
  }
}

const bool registered = [] {
  register_type<float>("f32");
  register_type<double>("f64");
  return true;
}();

}  // namespace
