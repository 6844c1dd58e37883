// bd/kernel/cholesky.hpp — Cholesky factors of small symmetric matrices (r×r, r = d_h): A = L·Lᵀ
// for a positive definite A, and A ≈ F·Fᵀ with pivoting for a semidefinite one.
//
// Preparation factors a Gram per product two to four times (the Cholesky QR's UᵀU, the
// geometry's VᵀV, the refit's B̂B̂ᵀ). Blocked by columns, left-looking as LAPACK's xPOTRF: a
// panel of 32 columns is first brought up to date by one product with the columns left of it,
// on the dispatched kernel (matmul.hpp), then factored by column updates along its contiguous
// columns; so the r³/3 flops run on the CPU's vectors and a program that factors compiles no
// code of its own for them. rcond() is LAPACK's and Eigen's 1-norm estimate
// (condition_estimate.hpp), from which thresholds set against Eigen's LLT keep their meaning.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <Eigen/Core>

#include "bd/base/error.hpp"
#include "bd/base/workspace.hpp"
#include "bd/kernel/condition_estimate.hpp"
#include "bd/kernel/inverse.hpp"
#include "bd/kernel/matmul.hpp"

namespace bd::kernel {

template <typename T>
class Cholesky {
public:
  using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
  using Vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;

  Cholesky() = default;
  template <typename Derived>
  explicit Cholesky(const Eigen::MatrixBase<Derived>& A, Workspace& ws = default_workspace()) {
    compute(A, ws);
  }

  /// Factors the symmetric A, reading its lower triangle (any expression; copied into storage
  /// reused between calls). ok() tells whether A was numerically positive definite: a pivot
  /// that is not positive (or NaN) stops the factorization.
  template <typename Derived>
  Cholesky& compute(const Eigen::MatrixBase<Derived>& A, Workspace& ws = default_workspace()) {
    if (A.rows() != A.cols())
      throw ShapeError(bd::detail::message("Cholesky: A is ", A.rows(), "x", A.cols(), ", expected a square matrix"));
    L_ = A.template cast<T>();
    factor(ws);
    return *this;
  }

  /// Whether the last compute() succeeded (A positive definite to working precision).
  bool ok() const { return ok_; }
  Index size() const { return L_.rows(); }
  /// ‖A‖₁ of the symmetric A whose lower triangle was read.
  double norm1() const { return norm1_; }
  /// L, lower triangular (zero above the diagonal), when ok().
  const Matrix& matrixL() const { return L_; }

  /// x = A⁻¹·b = L⁻ᵀ·L⁻¹·b, by substitution along the columns of L and of Lᵀ (a copy made by
  /// compute()): every step one contiguous update the compiler vectorises.
  Vector solve(const Vector& b) const {
    Vector x = b;
    const Index n = size();
    for (Index p = 0; p < n; ++p) {  // L·y = b: y_p final, then taken from the rows below
      x(p) /= L_(p, p);
      const T xp = x(p);
      const T* col = &L_(0, p);
      for (Index i = p + 1; i < n; ++i) x(i) -= xp * col[i];
    }
    for (Index p = n - 1; p >= 0; --p) {  // Lᵀ·x = y: x_p final, then taken from the rows above
      x(p) /= L_(p, p);
      const T xp = x(p);
      const T* col = &Lt_(0, p);
      for (Index i = 0; i < p; ++i) x(i) -= xp * col[i];
    }
    return x;
  }

  /// Reciprocal 1-norm condition number of A (estimate, see condition_estimate.hpp); 0 unless ok().
  double rcond() const {
    if (!ok_) return 0.0;
    const auto solve_vector = [](const void* self, const Vector& v, bool) {  // A = Aᵀ
      return static_cast<const Cholesky*>(self)->solve(v);
    };
    return detail::rcond_estimate<T>(size(), norm1_, {this, solve_vector});
  }

  /// out = A⁻¹ = L⁻ᵀ·L⁻¹, exactly symmetric: the triangular inverse on the CPU's vectors and its
  /// Gram on the kernel (inverse.hpp, matmul.hpp).
  void inverse_into(Matrix& out, Workspace& ws = default_workspace()) const {
    Matrix& Linv = ws.local<detail::InverseScratch<T>>().Linv;
    lower_inverse_into<Eigen::Lower>(L_, Linv, ws);
    out.resize(Linv.rows(), Linv.cols());
    gram_into(Linv, out, ws);
  }

private:
  static constexpr Index panel = 32;

  void factor(Workspace& ws);  // defined below the class: a library can hold it (BD_CHOLESKY_INSTANTIATIONS)

  Matrix L_, Lt_, update_;
  double norm1_ = 0;
  bool ok_ = false;
};

template <typename T>
void Cholesky<T>::factor(Workspace& ws) {
  const Index n = L_.rows();
  norm1_ = 0;  // column j of the symmetric A: its lower part down column j, its upper part along row j
  for (Index j = 0; j < n; ++j)
    norm1_ = std::max(norm1_, double(L_.col(j).tail(n - j).cwiseAbs().sum() + L_.row(j).head(j).cwiseAbs().sum()));
  ok_ = true;
  for (Index k = 0; k < n && ok_; k += panel) {
    const Index b = std::min(panel, n - k);
    if (k > 0) {  // A[k:, k:k+b] −= L[k:, :k]·L[k:k+b, :k]ᵀ
      update_.resize(n - k, b);
      matmul_into(L_.block(k, 0, n - k, k), L_.block(k, 0, b, k).transpose(), update_, ws);
      L_.block(k, k, n - k, b) -= update_;
    }
    for (Index j = k; j < k + b; ++j) {  // column j from the panel's columns before it
      T* lj = &L_(0, j);
      for (Index p = k; p < j; ++p) {
        const T a = L_(j, p);
        const T* lp = &L_(0, p);
        for (Index i = j; i < n; ++i) lj[i] -= a * lp[i];
      }
      if (!(lj[j] > T(0))) {
        ok_ = false;
        break;
      }
      const T d = std::sqrt(lj[j]);
      lj[j] = d;
      for (Index i = j + 1; i < n; ++i) lj[i] /= d;
    }
  }
  for (Index j = 1; j < n; ++j) L_.col(j).head(j).setZero();
  if (ok_) Lt_ = L_.transpose();
}

/// F (n×k) with A ≈ F·Fᵀ for a symmetric positive semidefinite A, by Cholesky with complete
/// (diagonal) pivoting (Higham, "Accuracy and Stability of Numerical Algorithms", §10.3; LAPACK's
/// xPSTRF): each step takes the largest remaining diagonal, and the factorization stops when it
/// falls to n·u·max A_ii, LAPACK's default tolerance — what is left, ‖A − F·Fᵀ‖ of that order, is
/// rounding. k is A's numerical rank. The rows of F are in A's order.
template <typename Derived>
Eigen::Matrix<typename Derived::Scalar, Eigen::Dynamic, Eigen::Dynamic> semidefinite_factor(const Eigen::MatrixBase<Derived>& A) {
  using T = typename Derived::Scalar;
  using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
  const Index n = A.rows();
  if (A.cols() != n)
    throw ShapeError(bd::detail::message("semidefinite_factor: A is ", n, "x", A.cols(), ", expected a square matrix"));
  Matrix W = A;  // the trailing block, updated in place, rows and columns swapped together
  std::vector<Index> order(static_cast<std::size_t>(n));
  for (Index i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  const T tolerance = T(n) * std::numeric_limits<T>::epsilon() * (n ? W.diagonal().maxCoeff() : T(0));
  Index k = 0;
  for (; k < n; ++k) {
    Index p = k;
    for (Index i = k + 1; i < n; ++i)
      if (W(i, i) > W(p, p)) p = i;
    if (!(W(p, p) > tolerance)) break;
    if (p != k) {
      W.row(k).swap(W.row(p));
      W.col(k).swap(W.col(p));
      std::swap(order[static_cast<std::size_t>(k)], order[static_cast<std::size_t>(p)]);
    }
    const T d = std::sqrt(W(k, k));
    W(k, k) = d;
    for (Index i = k + 1; i < n; ++i) W(i, k) /= d;
    for (Index c = k + 1; c < n; ++c)  // W[k+1:, k+1:] −= w·wᵀ, w the column below the pivot
      for (Index i = k + 1; i < n; ++i) W(i, c) -= W(i, k) * W(c, k);
  }
  Matrix F = Matrix::Zero(n, k);
  for (Index i = 0; i < n; ++i)
    for (Index j = 0; j <= std::min(i, k - 1); ++j) F(order[static_cast<std::size_t>(i)], j) = W(i, j);
  return F;
}

/// The instantiations bd::compiled holds (src/compiled_kernel.cpp), extern under BD_COMPILED_LIB.
#define BD_CHOLESKY_INSTANTIATIONS(prefix) \
  prefix class Cholesky<float>;            \
  prefix class Cholesky<double>;
#ifdef BD_COMPILED_LIB
BD_CHOLESKY_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::kernel
