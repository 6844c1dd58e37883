// bd/kernel/matmul.hpp — a plain product a·b on the dispatched kernel, for preparation.
//
// Preparation runs in double (forming B = U_S·Vᵀ, Grams, refits). Eigen's own products are
// compiled with the flags of the program that includes bd — SSE2 in a default build, a quarter
// of what an AVX2 or AVX-512 core does in double. Products large enough to matter go through
// bd::kernel::gemm (runtime-dispatched); small ones stay with Eigen, where the call costs less.
#pragma once

#include <numeric>
#include <vector>

#include <Eigen/Core>

#include "bd/kernel/gemm.hpp"

namespace bd::kernel {

/// Multiply-adds below which matmul() leaves the product to Eigen.
inline constexpr Index matmul_threshold = Index(64) * 64 * 64;

/// out = a·b (a: L×K, b: K×N, any strides). On up to omp_get_max_threads() threads, one inside
/// a parallel region (preparation's per-head loops).
template <typename T>
void matmul_into(const Eigen::Ref<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>>& a,
                 const Eigen::Ref<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>>& b,
                 Eigen::Ref<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>> out) {
  eigen_assert(a.cols() == b.rows() && out.rows() == a.rows() && out.cols() == b.cols() && "matmul: shapes disagree");
  if (a.rows() * a.cols() * b.cols() < matmul_threshold || a.rows() <= detail::skinny_rows) {
    out.noalias() = a * b;
    return;
  }
  std::vector<Index> channels(static_cast<std::size_t>(a.cols()));
  std::iota(channels.begin(), channels.end(), Index(0));
  GemmArguments<T, T> args;
  args.rows = a.rows();
  args.x = a.data(), args.ldx = a.outerStride();
  args.b = b.data(), args.ldb = b.outerStride();
  args.out = out.data(), args.ldo = out.outerStride();
  args.segments.push_back({channels.data(), a.cols(), 0, b.cols()});
  gemm(args);
}

/// a·b as a new matrix. Transposed operands are evaluated (copied) first: the copy is
/// O(size), the product O(size·depth).
template <typename DerivedA, typename DerivedB>
Eigen::Matrix<typename DerivedA::Scalar, Eigen::Dynamic, Eigen::Dynamic> matmul(const Eigen::MatrixBase<DerivedA>& a,
                                                                              const Eigen::MatrixBase<DerivedB>& b) {
  using T = typename DerivedA::Scalar;
  using M = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
  M out(a.rows(), b.cols());
  if (a.rows() * a.cols() * b.cols() < matmul_threshold) {
    out.noalias() = a * b;
  } else {
    matmul_into<T>(a, b, out);
  }
  return out;
}

}  // namespace bd::kernel
