// bd/core/validate.hpp — argument checks shared by every entry point, with actionable messages.
#pragma once

#include <cmath>
#include <string>

#include <Eigen/Core>

#include "bd/core/error.hpp"
#include "bd/core/scalar.hpp"

namespace bd::detail {

template <typename Derived>
std::string shape_of(const Eigen::MatrixBase<Derived>& m) {
  return message(m.rows(), "x", m.cols());
}

template <typename Derived>
void require_nonempty(const Eigen::MatrixBase<Derived>& m, const std::string& name) {
  if (m.rows() == 0 || m.cols() == 0)
    throw ShapeError(message(name, " is empty (", shape_of(m), "): expected a matrix with at least one row and one column"));
}

/// Throws NonFiniteError naming the first NaN or Inf entry of m.
template <typename Derived>
void require_finite(const Eigen::MatrixBase<Derived>& m, const std::string& name) {
  if (m.derived().allFinite()) return;  // vectorised; the search below only names the entry
  for (Eigen::Index j = 0; j < m.cols(); ++j) {
    for (Eigen::Index i = 0; i < m.rows(); ++i) {
      const double x = static_cast<double>(m.coeff(i, j));
      if (!std::isfinite(x))
        throw NonFiniteError(message(name, " (", shape_of(m), ") holds ", x, " at (", i, ", ", j,
                                     "): expected finite weights (NaN/Inf usually means a corrupt or "
                                     "overflowed checkpoint)"));
    }
  }
}

/// rank must satisfy 0 < rank < min(rows, cols) for BD to save anything.
inline void require_rank(Eigen::Index rank, Eigen::Index rows, Eigen::Index cols, const std::string& name) {
  const Eigen::Index limit = std::min(rows, cols);
  if (rank <= 0 || rank >= limit)
    throw RangeError(message("rank ", rank, " is out of range for ", name, " (", rows, "x", cols,
                             "): expected 0 < rank < min(m, n) = ", limit));
}

}  // namespace bd::detail
