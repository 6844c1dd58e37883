// bd/kernel/small_lu.hpp — LU with partial pivoting of small square matrices (r×r, r = d_h),
// on the micro-kernels of the CPU the program runs on.
//
// Ranking a basis window factors one r×r block per window and product (25 windows × 864
// products for DeepSeek-V2-Lite). Eigen's PartialPivLU runs at the SIMD width the program was
// compiled for (SSE2 without -march). Here the block is held row-major, so that the pivot row
// swap and every update of the trailing rows (row_i −= l_i·row_k) run along AVX-512 or AVX2
// vectors (micro_kernel_simd.inc, lu_rows: panels one vector wide, each trailing row updated
// once per panel). The same pivots as Eigen's PartialPivLU (the largest magnitude in the
// column, the first of equals); rcond() is the same Hager–Higham estimate of the 1-norm
// condition number.
#pragma once

#include <cmath>
#include <vector>

#include <Eigen/Core>

#include "bd/kernel/condition_estimate.hpp"
#include "bd/kernel/dispatch.hpp"
#include "bd/kernel/inverse.hpp"

namespace bd::kernel {

template <typename T>
class SmallLU {
public:
  using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
  using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  SmallLU() = default;
  template <typename Derived>
  explicit SmallLU(const Eigen::MatrixBase<Derived>& A) {
    compute(A);
  }

  /// Factors the square A (any expression; copied row-major into storage reused between calls).
  template <typename Derived>
  SmallLU& compute(const Eigen::MatrixBase<Derived>& A) {
    if (A.rows() != A.cols())
      throw ShapeError(bd::detail::message("SmallLU: A is ", A.rows(), "x", A.cols(), ", expected a square matrix"));
    const Index n = A.rows();
    // Rows padded with zeros to whole vectors of any ISA, plus 16 scratch rows (lu_rows' layout).
    const Index ld = (n + 15) / 16 * 16;
    if (buffer_.rows() != n + 16 || buffer_.cols() != ld) buffer_.setZero(n + 16, ld);
    buffer_.topLeftCorner(n, n) = A.template cast<T>();
    norm1_ = n ? static_cast<double>(buffer_.topLeftCorner(n, n).cwiseAbs().colwise().sum().maxCoeff()) : 0.0;
    perm_.resize(static_cast<std::size_t>(n));
    factor(n, ld);
    n_ = n;
    return *this;
  }

  Index size() const { return n_; }
  /// ‖A‖₁, the largest column sum of |A|.
  double norm1() const { return norm1_; }
  /// L (unit, strictly below the diagonal) and U (on and above it), row-major.
  /// (A block of the factorization's storage, read in place.)
  auto matrixLU() const { return buffer_.topLeftCorner(n_, n_); }
  /// Row i of P·A is row permutation()[i] of A.
  const std::vector<Index>& permutation() const { return perm_; }

  /// X = A⁻¹·B:  L·U·X = P·B, by substitution along the columns of L and U (a column-major
  /// copy of the factors, made by compute(); see substitute).
  template <typename Derived>
  Matrix solve(const Eigen::MatrixBase<Derived>& B) const {
    Matrix X(B.rows(), B.cols());
    for (Index i = 0; i < size(); ++i) X.row(i) = B.row(perm_[static_cast<std::size_t>(i)]).template cast<T>();
    substitute(columns_.data(), size(), X, false);
    return X;
  }

  /// X = A⁻ᵀ·B:  Aᵀ = Uᵀ·Lᵀ·P; the columns of Uᵀ and Lᵀ are the rows of U and L, read in place.
  template <typename Derived>
  Matrix solve_transposed(const Eigen::MatrixBase<Derived>& B) const {
    Matrix Z = B.template cast<T>();
    substitute(buffer_.data(), buffer_.cols(), Z, true);
    Matrix X(Z.rows(), Z.cols());
    for (Index i = 0; i < size(); ++i) X.row(perm_[static_cast<std::size_t>(i)]) = Z.row(i);
    return X;
  }

  /// out = A⁻¹ = U⁻¹·L⁻¹·P, the triangular inverses on the CPU's vectors and their product on
  /// the GEMM (inverse.hpp); nothing allocated once `out` and the thread's scratch in `ws` have
  /// this size.
  void inverse_into(Matrix& out, Workspace& ws = default_workspace()) const {
    const Index n = size();
    gather_.resize(static_cast<std::size_t>(n));  // column j of L⁻¹·P: column gather[j] of L⁻¹
    for (Index i = 0; i < n; ++i) gather_[static_cast<std::size_t>(perm_[static_cast<std::size_t>(i)])] = i;
    inverse_from_lu_into(matrixLU(), gather_, out, ws);
  }

  /// A⁻¹ as a new matrix (see inverse_into).
  Matrix inverse(Workspace& ws = default_workspace()) const {
    Matrix out;
    inverse_into(out, ws);
    return out;
  }

  /// Reciprocal 1-norm condition number, estimated as Eigen's PartialPivLU::rcond() does:
  /// 1/(‖A‖₁·est‖A⁻¹‖₁), Hager's power iteration with Higham's alternating safeguard (LAPACK
  /// xGECON). 0 for a singular U.
  double rcond() const {
    if (size() && !(matrixLU().diagonal().cwiseAbs().minCoeff() > T(0))) return 0.0;
    using Vec = Eigen::Matrix<T, Eigen::Dynamic, 1>;
    const auto solve_vector = [](const void* self, const Vec& v, bool transposed) {
      const SmallLU& lu = *static_cast<const SmallLU*>(self);
      return Vec(transposed ? lu.solve_transposed(v) : lu.solve(v));
    };
    return detail::rcond_estimate<T>(size(), norm1_, {this, solve_vector});
  }

private:
  /// X ← (lower)⁻¹·X, then X ← (upper)⁻¹·X, for the triangles of the n×n matrix
  /// t(i, p) = t[i + p·ldt]: L (unit) and U of the column-major copy, or Uᵀ and Lᵀ (unit) of
  /// the row-major factors when transposed. Column by column in the axpy form (x_p final, then
  /// taken from the other rows along column p of the triangle: contiguous, vectorised), four
  /// columns of X at a time so that each column of the triangle is loaded once for four updates
  /// (eight run out of registers; the dot form along rows makes its sums one dependent chain).
  void substitute(const T* t, Index ldt, Matrix& X, bool transposed) const {
    const Index k = X.cols(), whole = k / 4 * 4;
    for (Index c = 0; c < whole; c += 4) substitute_columns<4>(t, ldt, X, c, transposed);
    for (Index c = whole; c < k; ++c) substitute_columns<1>(t, ldt, X, c, transposed);
  }

  template <int G>
  void substitute_columns(const T* t, Index ldt, Matrix& X, Index c0, bool transposed) const {
    const Index n = n_;
    const bool unit_lower = !transposed;
    T* x[G];
    for (int g = 0; g < G; ++g) x[g] = X.data() + (c0 + g) * X.outerStride();
    T a[G];
    for (Index p = 0; p < n; ++p) {  // lower: x_p final, then taken from the rows below
      const T* col = t + p * ldt;
      for (int g = 0; g < G; ++g) a[g] = unit_lower ? x[g][p] : (x[g][p] /= col[p]);
      for (Index i = p + 1; i < n; ++i)
BD_UNROLL(4)
        for (int g = 0; g < G; ++g) x[g][i] -= a[g] * col[i];
    }
    for (Index p = n - 1; p >= 0; --p) {  // upper: x_p final, then taken from the rows above
      const T* col = t + p * ldt;
      for (int g = 0; g < G; ++g) a[g] = unit_lower ? (x[g][p] /= col[p]) : x[g][p];
      for (Index i = 0; i < p; ++i)
BD_UNROLL(4)
        for (int g = 0; g < G; ++g) x[g][i] -= a[g] * col[i];
    }
  }

  void factor(Index n, Index ld) {
    on_active_kernel<T>([&](auto k) { k.lu_rows(buffer_.data(), n, ld, perm_.data()); });
    // The column-major copy, in 16×16 tiles: a tile's 16 rows stay in L1 while its columns are
    // written (a plain transposing copy walks every row per column: 147 KB at r = 192).
    columns_.resize(n, n);
    for (Index j0 = 0; j0 < n; j0 += 16)
      for (Index i0 = 0; i0 < n; i0 += 16)
        for (Index j = j0; j < std::min(n, j0 + 16); ++j)
          for (Index i = i0; i < std::min(n, i0 + 16); ++i) columns_(i, j) = buffer_(i, j);
  }

  RowMatrix buffer_;  // (n + 16) × ld, see compute()
  Matrix columns_;    // the factors again, column-major (solve's substitution reads their columns)
  Index n_ = 0;  // the factored size (buffer_ holds it at the top left)
  std::vector<Index> perm_;
  mutable std::vector<Index> gather_;  // inverse_into's column order, kept between calls
  double norm1_ = 0;
};

/// The instantiations bd::compiled holds (src/compiled_kernel.cpp): every member but the
/// templates on the caller's expressions; extern under BD_COMPILED_LIB.
#define BD_SMALL_LU_INSTANTIATIONS(prefix) \
  prefix class SmallLU<float>;             \
  prefix class SmallLU<double>;
#ifdef BD_COMPILED_LIB
BD_SMALL_LU_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::kernel
