// bd/kernel/pivoted_qr.hpp — the column order of QR with column pivoting of a small matrix, on
// the micro-kernels of the CPU the program runs on.
//
// A per-head pivoted basis takes the r rows of W that Businger–Golub pivoting picks first
// (basis_selection.hpp): QR with column pivoting of Fᵀ (r × m, F isometric to W's rows), 864
// times for DeepSeek-V2-Lite. Eigen's ColPivHouseholderQR runs level-2 loops at the SIMD width
// the program was compiled for (SSE2 without -march) and forms what choosing does not need.
// Here each column of A is contiguous, so the reflector's dot product and update with every
// trailing column run along AVX-512 or AVX2 vectors (micro_kernel_simd.inc, qr_pivots), and
// only the pivot order and |R_jj| are kept. Same pivots as Eigen's in exact arithmetic (the
// column of largest remaining norm, the first of equal ones); in floating point they agree
// wherever the remaining norms differ by more than the rounding of the arithmetic type.
#pragma once

#include <algorithm>
#include <vector>

#include <Eigen/Core>

#include "bd/kernel/dispatch.hpp"

namespace bd::kernel {

template <typename T>
class ColumnPivots {
public:
  using Vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;

  /// Pivots the first `count` columns of A (any expression; copied into column-major storage
  /// reused between calls), count ≤ min(rows, cols).
  template <typename Derived>
  ColumnPivots& compute(const Eigen::MatrixBase<Derived>& A, Index count) {
    const Index rows = A.rows(), cols = A.cols();
    if (count < 0 || count > std::min(rows, cols))
      throw RangeError(bd::detail::message("ColumnPivots: ", count, " columns asked of a ", rows, "x", cols,
                                           " matrix; expected 0 ≤ count ≤ min(rows, cols)"));
    const Index ld = (rows + 15) / 16 * 16;  // whole vectors of any ISA, rows past `rows` zero
    if (buffer_.rows() != ld || buffer_.cols() != cols) buffer_.setZero(ld, cols);
    buffer_.topRows(rows) = A.template cast<T>();
    order_.resize(static_cast<std::size_t>(cols));
    diag_.resize(count);
    scratch_.resize(2 * cols + ld);
    factor(rows, ld, cols, count);
    order_.resize(static_cast<std::size_t>(count));
    return *this;
  }

  /// The columns of A in the order they were chosen (count of them).
  const std::vector<Index>& order() const { return order_; }
  /// |R_jj| of A·P = Q·R: the norm of the j-th chosen column's part orthogonal to those before.
  const Vector& r_diagonal() const { return diag_; }

private:
  void factor(Index rows, Index ld, Index cols, Index count) {
    T* a = buffer_.data();
    Index* perm = order_.data();
    T* diag = diag_.data();
    T* scratch = scratch_.data();
    on_active_kernel<T>([&](auto k) { k.qr_pivots(a, rows, ld, cols, count, perm, diag, scratch); });
  }

  Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic> buffer_;  // ld × cols, see compute()
  std::vector<Index> order_;
  Vector diag_, scratch_;
};

}  // namespace bd::kernel
