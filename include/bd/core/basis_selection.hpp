// bd/core/basis_selection.hpp — which r rows (columns) become the basis.
//
// Candidates: First, Last, ResidualMin {first, last}, OffsetSearch (windows at multiples of
// align, plus the last window), Pivoted (QR with column pivoting in W's geometry).
//
// Ranking. In exact arithmetic every non-singular window is exact; what differs is how much
// the rounding of B and C to the storage type is amplified. To first order the stored product
// errs by E_R ≈ ΔC·B + C·ΔB on the rebuilt rows and E_S = −ΔB on the basis rows. With
// independent relative rounding errors of variance u²/3 (u the unit roundoff),
//     E‖E‖²_F ≈ (u²/3)·(2‖C·D‖²_F + ‖D‖²_F),    D = diag(‖W_s‖ : s ∈ S),
// and since C = Q_R·Q_S⁻¹ with Q orthonormal, ‖C·D‖²_F = ‖Q_S⁻¹·D‖²_F − ‖D‖²_F exactly.
// Every window is first ranked by a Gaussian sketch of ‖C·D‖_F (one r×r LU and k right-hand
// sides: Ω_Rᵀ·C = (ΩᵀQ)·Q_S⁻¹ − Ω_Sᵀ), then the few best are re-ranked by the exact model
// value; only the winner is fitted and its exact residual computed (coefficient_fit.hpp).
#pragma once

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include <Eigen/LU>
#include <Eigen/QR>

#include "bd/core/factored_product.hpp"
#include "bd/core/options.hpp"
#include "bd/kernel/inverse.hpp"

namespace bd::detail {

/// Below this reciprocal condition number (1-norm estimate) a basis block is singular in the
/// double precision preparation runs in: C would carry no correct digit.
inline constexpr double singular_rcond = 1e-12;

inline std::vector<Index> contiguous(Index offset, Index r) {
  std::vector<Index> s(static_cast<std::size_t>(r));
  std::iota(s.begin(), s.end(), offset);
  return s;
}

inline std::vector<Index> complement(const std::vector<Index>& sorted, Index m) {
  std::vector<Index> out;
  out.reserve(static_cast<std::size_t>(m) - sorted.size());
  std::size_t k = 0;
  for (Index i = 0; i < m; ++i) {
    if (k < sorted.size() && sorted[k] == i) ++k;
    else out.push_back(i);
  }
  return out;
}

/// Window offsets a contiguous strategy considers, for m rows and rank r.
inline std::vector<Index> candidate_offsets(Basis basis, Index m, Index r, Index align, Index offset = 0) {
  const Index last = m - r;
  switch (basis) {
    case Basis::Window:
      if (offset < 0 || offset > last)
        throw RangeError(message("Options::offset ", offset, " puts the window outside the ", m,
                                 " rows (columns): expected 0 <= offset <= ", last));
      return {offset};
    case Basis::First: return {0};
    case Basis::Last: return {last};
    case Basis::ResidualMin: return last == 0 ? std::vector<Index>{0} : std::vector<Index>{0, last};
    default: break;
  }
  std::vector<Index> out;
  for (Index o = 0; o <= last; o += align) out.push_back(o);
  if (out.back() != last) out.push_back(last);
  return out;
}

/// Ranking value of one index set: the rounding model's estimate of ‖E‖²/(u²/3), or +inf when
/// the basis block is singular. `exact` computes ‖Q_S⁻¹·D‖² instead of sketching it.
struct WindowScore {
  double model = std::numeric_limits<double>::infinity();  ///< 2‖C·D‖² + ‖D‖²
  double rcond = 0;
  bool singular() const { return !(model < std::numeric_limits<double>::infinity()); }
};

/// Above this reciprocal condition a block factored in float is far from singular in double
/// too (float's LU resolves rcond down to about 1e-6); below it the window is scored in double.
inline constexpr double float_score_rcond = 1e-4;

inline WindowScore score_window(const FactoredProduct& p, const std::vector<Index>& S, bool exact) {
  WindowScore score;
  const Eigen::VectorXd D = p.row_norm2(S).cwiseSqrt();
  const double d2 = D.squaredNorm();
  if (!exact) {
    // Ranking only, to a few digits: the LU and the k-column solve in float, twice as fast as
    // double at any SIMD width. Ω_Rᵀ·C = (ΩᵀQ)·Q_S⁻¹ − Ω_Sᵀ;   E‖Ω_Rᵀ·C·D‖² = k·‖C·D‖².
    const bool window = S.back() - S.front() + 1 == static_cast<Index>(S.size());
    Eigen::PartialPivLU<Eigen::MatrixXf> lu(window ? Eigen::MatrixXf(p.Qt.middleCols(S.front(), p.r()))
                                                   : Eigen::MatrixXf(p.Qt(Eigen::all, S)));
    const double rcond = lu.rcond();
    if (rcond > float_score_rcond) {
      Eigen::MatrixXd X = lu.solve(p.sketch_t).transpose().template cast<double>();
      X -= p.omega(S, Eigen::all).transpose();
      score.rcond = rcond;
      score.model = 2 * (X * D.asDiagonal()).squaredNorm() / static_cast<double>(p.sketch.rows()) + d2;
      return score;
    }
  }
  const Eigen::MatrixXd QS = p.Q(S, Eigen::all);
  Eigen::PartialPivLU<Eigen::MatrixXd> lu(QS.transpose());
  score.rcond = lu.rcond();
  if (!(score.rcond >= singular_rcond)) return score;
  double cd2;
  if (exact) {
    // ‖C·D‖² = ‖Q_S⁻¹·D‖² − ‖D‖²  (rows S of Q·Q_S⁻¹ are the identity).
    const Eigen::MatrixXd inv = bd::kernel::inverse(lu).transpose();
    cd2 = std::max(0.0, (inv * D.asDiagonal()).squaredNorm() - d2);
  } else {
    Eigen::MatrixXd X = lu.solve(p.sketch.transpose()).transpose();
    X -= p.omega(S, Eigen::all).transpose();
    cd2 = (X * D.asDiagonal()).squaredNorm() / static_cast<double>(p.sketch.rows());
  }
  score.model = 2 * cd2 + d2;
  return score;
}

/// Basis rows chosen by QR with column pivoting on Fᵀ, F isometric to W's rows: the r most
/// independent rows of W (Businger–Golub), returned ascending.
inline std::vector<Index> pivoted_indices(const FactoredProduct& p) {
  const Eigen::MatrixXd F = row_geometry(p);
  Eigen::ColPivHouseholderQR<Eigen::MatrixXd> qr(F.transpose());
  const auto& perm = qr.colsPermutation().indices();
  std::vector<Index> s(static_cast<std::size_t>(p.r()));
  for (Index j = 0; j < p.r(); ++j) s[static_cast<std::size_t>(j)] = perm(j);
  std::sort(s.begin(), s.end());
  return s;
}

}  // namespace bd::detail
