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
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include <Eigen/Core>

#include "bd/base/code_size.hpp"
#include "bd/base/deferred.hpp"
#include "bd/core/factored_product.hpp"
#include "bd/core/options.hpp"
#include "bd/kernel/inverse.hpp"
#include "bd/kernel/pivoted_qr.hpp"
#include "bd/kernel/small_lu.hpp"

namespace bd::ranking {

/// Below this reciprocal condition number (1-norm estimate) a basis block is singular in the
/// double precision preparation runs in: C would carry no correct digit.
inline constexpr double singular_rcond = 1e-12;

inline std::vector<Index> contiguous(Index offset, Index r) {
  std::vector<Index> s(static_cast<std::size_t>(r));
  std::iota(s.begin(), s.end(), offset);
  return s;
}

/// Whether ascending basis rows S form one contiguous window (read as a block, not gathered).
inline bool is_window(const std::vector<Index>& S) {
  return !S.empty() && S.back() - S.front() + 1 == static_cast<Index>(S.size());
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
        throw RangeError(bd::detail::message("Options::offset ", offset, " puts the window outside the ", m,
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

/// Above this reciprocal condition a block factored in float is scored in float; below it, in
/// double. Q rounded to float moves a block's reciprocal condition by about 1e-7, so a block
/// above 1e-5 in float is far from singular in double too (singular_rcond = 1e-12). A ranking
/// value needs a few digits: in float ‖Q_S⁻¹·D‖² errs by about κ·u₃₂ ≤ 6e-3 relative here
/// (the well-conditioned windows that rank first err far less), the sketch by sqrt(2/k) ≈ 0.5.
/// Orthonormal 512×128 factors give 128×128 blocks with rcond 1e-5…1e-3: nearly all in float.
/// The float condition is read off what the score computes anyway (no estimator's extra
/// solves): exactly, 1/(‖Q_Sᵀ‖₁·‖Q_S⁻ᵀ‖₁) from the inverse; sketched, 1/(‖Q_S‖_F·‖Q_S⁻¹‖_F)
/// with ‖Q_S⁻¹‖²_F ≈ ‖Y‖²_F/k (Y below: Qᵀ·Ω is standard Gaussian, Q having orthonormal
/// columns), within a factor √r of the 1-norm figure and the sketch's spread — far inside the
/// margin of this threshold.
inline constexpr double float_score_rcond = 1e-5;

/// 2‖C·D‖² + ‖D‖² from inv_t = (Q_Sᵀ)⁻¹ = (Q_S⁻¹)ᵀ:
/// ‖C·D‖² = ‖Q_S⁻¹·D‖² − ‖D‖² (rows S of Q·Q_S⁻¹ are the identity), and
/// ‖Q_S⁻¹·D‖² = Σ_s D_s²·‖column s of Q_S⁻¹‖², the columns of Q_S⁻¹ being the rows of inv_t.
template <typename T>
double exact_model(const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>& inv_t, const Eigen::VectorXd& D) {
  const Eigen::VectorXd row2 = inv_t.cwiseAbs2().rowwise().sum().template cast<double>();
  const double sum = row2.dot(D.cwiseAbs2());
  const double d2 = D.squaredNorm();
  return 2 * std::max(0.0, sum - d2) + d2;
}

/// 2·‖Ω_Rᵀ·C·D‖²/k + ‖D‖² from Y = (Q_Sᵀ)⁻¹·(ΩᵀQ)ᵀ (r×k): Ω_Rᵀ·C = Yᵀ − Ω_Sᵀ.
template <typename T>
double sketched_model(const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>& Y, const FactoredProduct& p,
                      const std::vector<Index>& S, const Eigen::VectorXd& D) {
  const Index k = Y.cols();
  double sum = 0;
  for (Index s = 0; s < Y.rows(); ++s) {
    double row = 0;
    for (Index j = 0; j < k; ++j) {
      const double v = static_cast<double>(Y(s, j)) - (*p.omega)(S[static_cast<std::size_t>(s)], j);
      row += v * v;
    }
    sum += D(s) * D(s) * row;
  }
  return 2 * sum / static_cast<double>(k) + D.squaredNorm();
}

/// A thread's scratch for scoring windows (in the preparation's Workspace): the float LU and the
/// inverse of the exact score. This runs for every window of every product.
struct ScoreScratch {
  Eigen::MatrixXf QS;  // Q_S in float, gathered once (a window's rows or any set's)
  bd::kernel::SmallLU<float> lu;
  Eigen::MatrixXf inv_t;
  bd::kernel::SmallLU<double> lu_double;
  Eigen::MatrixXd inv_double;
};

/// score_window for a block too ill-conditioned to score in float: the LU in double. Rare (the
/// blocks of orthonormal 512×128 factors score in float nearly all), so its own code is compiled
/// for size; the LU, its condition estimate and the inverse it calls are the kernels'.
BD_DEFERRED BD_COLD WindowScore score_window_in_double(const FactoredProduct& p, const std::vector<Index>& S, bool exact,
                                                       const Eigen::VectorXd& D, ScoreScratch& scratch, Workspace& ws) {
  WindowScore score;
  bd::kernel::SmallLU<double>& lu = scratch.lu_double;
  lu.compute(p.Q(S, Eigen::all).transpose());
  score.rcond = lu.rcond();
  if (!(score.rcond >= singular_rcond)) return score;
  if (exact) lu.inverse_into(scratch.inv_double, ws);
  score.model = exact ? exact_model(scratch.inv_double, D) : sketched_model(lu.solve(p.sketch.transpose()), p, S, D);
  return score;
}

BD_DEFERRED WindowScore score_window(const FactoredProduct& p, const std::vector<Index>& S, bool exact,
                                Workspace& ws = default_workspace()) {
  const Eigen::VectorXd D = p.row_norm2(S).cwiseSqrt();
  ScoreScratch& scratch = ws.local<ScoreScratch>();
  {
    // Ranking only, to a few digits: the LU in float, on the CPU's vectors (kernel/small_lu.hpp).
    // Sketched: Ω_Rᵀ·C = (ΩᵀQ)·Q_S⁻¹ − Ω_Sᵀ;   E‖Ω_Rᵀ·C·D‖² = k·‖C·D‖².
    Eigen::MatrixXf& QS = scratch.QS;
    if (is_window(S)) QS = p.Qf.middleRows(S.front(), p.r());
    else QS = p.Qf(S, Eigen::all);
    bd::kernel::SmallLU<float>& lu = scratch.lu;
    lu.compute(QS.transpose());
    double rcond, model;
    if (exact) {
      Eigen::MatrixXf& inv_t = scratch.inv_t;
      lu.inverse_into(inv_t, ws);
      rcond = 1.0 / (lu.norm1() * double(inv_t.cwiseAbs().colwise().sum().maxCoeff()));
      model = exact_model(inv_t, D);
    } else {
      const Eigen::MatrixXf Y = lu.solve(p.sketch_t);
      rcond = 1.0 / std::sqrt(double(QS.squaredNorm()) * double(Y.squaredNorm()) / double(Y.cols()));
      model = sketched_model(Y, p, S, D);
    }
    if (rcond > float_score_rcond && model < std::numeric_limits<double>::infinity()) {
      WindowScore score;
      score.rcond = rcond;
      score.model = model;
      return score;
    }
  }
  return score_window_in_double(p, S, exact, D, scratch, ws);
}

/// Pivots are chosen in float when |R_rr| ≥ this × |R_11|. Householder QR in float errs in the
/// remaining norms by about m·u₃₂·|R_11| (backward stable; ≈ 3e-5·|R_11| at m = 512), so every
/// norm a choice is made between is then known to a few percent, and a row within that of the
/// largest is as good a basis row. Below it (W's condition beyond ≈ 1e3) the pivots are chosen
/// again in double, where the same holds down to |R_rr| ≈ 1e-12·|R_11|.
inline constexpr double float_pivot_ratio = 1e-3;

/// Basis rows chosen by QR with column pivoting on Fᵀ, F isometric to W's rows: the r most
/// independent rows of W (Businger–Golub), returned ascending. On the CPU's vectors
/// (kernel/pivoted_qr.hpp), their buffers kept in the Workspace: this runs for every product.
struct PivotScratch {
  Eigen::MatrixXd Ft;  // the row geometry, transposed
  bd::kernel::ColumnPivots<float> in_float;
  bd::kernel::ColumnPivots<double> in_double;
};

BD_DEFERRED std::vector<Index> pivoted_indices(const FactoredProduct& p, Workspace& ws) {
  PivotScratch& scratch = ws.local<PivotScratch>();
  Eigen::MatrixXd& Ft = scratch.Ft;
  row_geometry_transposed(p, Ft, ws);
  const Index r = p.r();
  bd::kernel::ColumnPivots<float>& in_float = scratch.in_float;
  bd::kernel::ColumnPivots<double>& in_double = scratch.in_double;
  in_float.compute(Ft, r);
  const auto& d = in_float.r_diagonal();
  const bool resolved = r == 0 || double(d(r - 1)) >= float_pivot_ratio * double(d(0));
  const std::vector<Index>& order = resolved ? in_float.order() : in_double.compute(Ft, r).order();
  std::vector<Index> s(order.begin(), order.end());
  std::sort(s.begin(), s.end());
  return s;
}

/// The instantiations bd::compiled holds (src/compiled_ranking.cpp).
#define BD_BASIS_SELECTION_INSTANTIATIONS(prefix)                                                         \
  prefix WindowScore score_window<>(const FactoredProduct&, const std::vector<Index>&, bool, Workspace&); \
  prefix std::vector<Index> pivoted_indices<>(const FactoredProduct&, Workspace&);
#ifdef BD_COMPILED_LIB
BD_BASIS_SELECTION_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::ranking

namespace bd::detail {
using namespace bd::ranking;  // preparation's stages call the ranking stage's pieces unqualified
}  // namespace bd::detail
