// bd/kernel/condition_estimate.hpp — the reciprocal 1-norm condition number of a factored
// matrix, estimated from a few solves with it (SmallLU, Cholesky).
//
// κ₁(A) = ‖A‖₁·‖A⁻¹‖₁, and ‖A⁻¹‖₁ is estimated without forming A⁻¹: Hager's power iteration on
// the convex function x ↦ ‖A⁻¹x‖₁ over the unit 1-ball (each step one solve with A and one with
// Aᵀ), with Higham's alternating-sign vector as a safeguard against the matrices that fool it —
// LAPACK's xGECON, and what Eigen's rcond() of its LU and LLT computes. A lower bound on
// ‖A⁻¹‖₁, almost always within a factor of 3 of it.
#pragma once

#include <algorithm>
#include <cmath>

#include <Eigen/Core>

#include "bd/base/index.hpp"

namespace bd::kernel::detail {

/// A factored matrix's solves on vectors, as the estimator calls them: solve(factors, v, false)
/// returns A⁻¹v, solve(factors, v, true) A⁻ᵀv. A plain function pointer, so that the estimator is
/// compiled once per scalar type rather than once per factorization (SmallLU, Cholesky).
template <typename T>
struct VectorSolves {
  using Vec = Eigen::Matrix<T, Eigen::Dynamic, 1>;
  const void* factors;
  Vec (*solve)(const void* factors, const Vec& v, bool transposed);
  Vec operator()(const Vec& v, bool transposed = false) const { return solve(factors, v, transposed); }
};

/// 1/(‖A‖₁·est‖A⁻¹‖₁) for an n×n A with ‖A‖₁ = norm1, given its solves. 0 when ‖A‖₁ is zero
/// or the estimate is.
template <typename T>
double rcond_estimate(Index n, double norm1, const VectorSolves<T>& solves) {
  using Vec = typename VectorSolves<T>::Vec;
  const auto solve = [&](const Vec& v) { return solves(v, false); };
  const auto solve_transposed = [&](const Vec& v) { return solves(v, true); };
  if (n == 0) return 1.0;
  if (norm1 == 0) return 0.0;
  const auto l1 = [](const Vec& v) { return static_cast<double>(v.template lpNorm<1>()); };
  const auto sign = [](const Vec& v) { return Vec(v.unaryExpr([](T x) { return x < T(0) ? T(-1) : T(1); })); };
  Vec v = solve(Vec::Constant(n, T(1) / T(n)));
  double bound = l1(v);
  if (n > 1) {
    Vec s = sign(v);
    v = solve_transposed(s);
    Index at;
    v.cwiseAbs().maxCoeff(&at);
    double old_bound = bound;
    for (int k = 0; k < 4; ++k) {
      v = solve(Vec::Unit(n, at));
      bound = l1(v);
      if (bound <= old_bound) break;
      const Vec s_new = sign(v);
      if (s_new == s) break;
      s = s_new;
      v = solve_transposed(s);
      Index next;
      v.cwiseAbs().maxCoeff(&next);
      if (next == at) break;
      at = next;
      old_bound = bound;
    }
    Vec alt(n);
    for (Index i = 0; i < n; ++i) alt(i) = T((i % 2 ? -1.0 : 1.0) * (1.0 + double(i) / double(n - 1)));
    bound = std::max(bound, 2 * l1(solve(alt)) / (3.0 * double(n)));
  }
  return bound > 0 ? (1.0 / norm1) / bound : 0.0;
}

}  // namespace bd::kernel::detail
