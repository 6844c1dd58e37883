// bd/kernel/householder_qr.hpp — an orthonormal basis of a tall matrix's range and its numerical
// rank, by Householder QR with column pivoting.
//
// Preparation's fallback when the Cholesky QR cannot factor U (κ(U) > 10⁶, factored_product.hpp):
// rare, so written plainly (level-2 loops along contiguous columns, 4mn² flops with forming Q)
// and compiled for double only, instead of a program compiling Eigen's blocked
// ColPivHouseholderQR and its GEMM for it. Pivots and rank are Businger–Golub's as Eigen's and
// LAPACK's xGEQP3 take them: the column of largest remaining norm (norms recomputed each step,
// not downdated), and rank = #{j : |R_jj| > n·u·max |R_jj|}, Eigen's default threshold.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <Eigen/Core>

#include "bd/base/code_size.hpp"
#include "bd/base/error.hpp"
#include "bd/base/index.hpp"

namespace bd::kernel {

/// Q (m×n, QᵀQ = I) spanning the columns of A (m×n, m ≥ n) when A has full column rank; returns
/// A's numerical rank (Q's leading `rank` columns span A's range in any case).
template <typename T>
BD_COLD Index householder_range(const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>& A,
                        Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>& Q) {
  const Index m = A.rows(), n = A.cols();
  if (m < n) throw ShapeError(bd::detail::message("householder_range: A is ", m, "x", n, ", expected rows ≥ columns"));
  Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic> R = A;  // R above the diagonal, the reflectors below
  std::vector<T> tau(static_cast<std::size_t>(n), T(0));
  T largest(0);
  Index rank = 0;
  for (Index j = 0; j < n; ++j) {
    Index p = j;
    T best(-1);
    for (Index c = j; c < n; ++c) {
      const T norm2 = R.col(c).tail(m - j).squaredNorm();
      if (norm2 > best) best = norm2, p = c;
    }
    if (p != j) R.col(j).swap(R.col(p));
    // H = I − τ·v·vᵀ maps R[j:, j] to (β, 0, …, 0), v_j = 1: Householder as LAPACK's xLARFG.
    T* rj = &R(0, j);
    const T alpha = rj[j], sigma = R.col(j).tail(m - j - 1).squaredNorm();
    T beta = alpha;
    if (sigma > T(0)) {
      beta = -std::copysign(std::sqrt(alpha * alpha + sigma), alpha);
      tau[static_cast<std::size_t>(j)] = (beta - alpha) / beta;
      const T scale = T(1) / (alpha - beta);
      for (Index i = j + 1; i < m; ++i) rj[i] *= scale;
      for (Index c = j + 1; c < n; ++c) {  // R[j:, c] −= τ·v·(vᵀ·R[j:, c])
        T* rc = &R(0, c);
        T w = rc[j];
        for (Index i = j + 1; i < m; ++i) w += rj[i] * rc[i];
        w *= tau[static_cast<std::size_t>(j)];
        rc[j] -= w;
        for (Index i = j + 1; i < m; ++i) rc[i] -= w * rj[i];
      }
    }
    rj[j] = beta;
    largest = std::max(largest, T(std::abs(beta)));
  }
  const T threshold = T(n) * std::numeric_limits<T>::epsilon() * largest;
  for (Index j = 0; j < n; ++j) rank += std::abs(R(j, j)) > threshold;
  // Q = H_0·H_1·…·H_{n−1}·I[:, :n], the reflectors applied from the last.
  Q.setIdentity(m, n);
  for (Index j = n - 1; j >= 0; --j) {
    const T t = tau[static_cast<std::size_t>(j)];
    if (t == T(0)) continue;
    const T* v = &R(0, j);
    for (Index c = j; c < n; ++c) {
      T* qc = &Q(0, c);
      T w = qc[j];
      for (Index i = j + 1; i < m; ++i) w += v[i] * qc[i];
      w *= t;
      qc[j] -= w;
      for (Index i = j + 1; i < m; ++i) qc[i] -= w * v[i];
    }
  }
  return rank;
}

}  // namespace bd::kernel
