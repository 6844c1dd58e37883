// bd/core/coefficient_fit.hpp — B and C for a chosen basis, rounded once, with the exact error.
//
// Through the factors (row form, basis rows S, other rows R, W = U·Vᵀ):
//   C  = U_R·U_S⁻¹ = Q_R·Q_S⁻¹                 one r×r LU, never the m×n product
//   B  = U_S·Vᵀ,  B̂ = round(B),  ΔB = B̂ − B
//   refit: C ← argmin ‖U_R·Vᵀ − C·B̂‖_F (least squares against the rounded basis); with
//          D = U_R − C·U_S, the normal equations need only r×r Grams:
//            B̂B̂ᵀ   = U_S·G·U_Sᵀ + U_S·(ΔB·V)ᵀ + (ΔB·V)·U_Sᵀ + ΔB·ΔBᵀ
//            E₀·B̂ᵀ = D·(G·U_Sᵀ + (ΔB·V)ᵀ) − C·((ΔB·V)·U_Sᵀ + ΔB·ΔBᵀ),  E₀ = U_R·Vᵀ − C·B̂
//   Ĉ = round(C)
//   exact error, D̂ = U_R − Ĉ·U_S:  W_R − Ĉ·B̂ = D̂·Vᵀ − Ĉ·ΔB, W_S − B̂ = −ΔB, so
//     ‖E‖² = ⟨D̂ᵀD̂, G⟩ − 2⟨ĈᵀD̂, ΔB·V⟩ + ⟨ĈᵀĈ, ΔB·ΔBᵀ⟩ + ‖ΔB‖²
//   All terms are already at the scale of the error, so the sum loses no digits to cancellation.
//   For a double target the figure is as accurate as double arithmetic allows (≈ 1e-30 NMSE).
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Cholesky>
#include <Eigen/LU>
#include <Eigen/QR>

#include "bd/core/basis_selection.hpp"
#include "bd/core/error.hpp"
#include "bd/core/factored_product.hpp"
#include "bd/core/scalar.hpp"
#include "bd/kernel/matmul.hpp"

namespace bd::detail {

/// A fitted basis in row form; B and C hold the rounded values, in double.
struct BasisFit {
  std::vector<Index> S;
  Eigen::MatrixXd B;  ///< r×n
  Eigen::MatrixXd C;  ///< (m−r)×r
  double residual2 = 0;
  double rcond = 0;
  bool refitted = false;
};

template <typename Scalar>
void require_representable(const Eigen::MatrixXd& rounded, const std::string& what, const std::string& name) {
  if (!rounded.allFinite())
    throw NonFiniteError(message(name, ": the ", what, " overflows ", scalar_traits<Scalar>::name,
                                 " (largest finite value ", max_finite<Scalar>(),
                                 "); store in a wider type or rescale the weights"));
}

inline void require_nonsingular(double rcond, const std::vector<Index>& S, const std::string& name) {
  if (!(rcond >= singular_rcond))
    throw SingularBasisError(message(name, ": the basis block at rows ", S.front(), "..", S.back(),
                                     " is singular (reciprocal condition ", rcond, " < ", singular_rcond,
                                     "); choose another window (offset-search, pivoted or auto skip such "
                                     "blocks) or leave this product dense"));
}

template <typename Scalar>
BasisFit fit_basis(const FactoredProduct& p, std::vector<Index> S, bool refit) {
  using Eigen::MatrixXd;
  BasisFit fit;
  const std::vector<Index> R = complement(S, p.m());
  const MatrixXd US = p.U(S, Eigen::all), UR = p.U(R, Eigen::all);
  const MatrixXd QS = p.Q(S, Eigen::all);

  Eigen::PartialPivLU<MatrixXd> lu(QS.transpose());
  fit.rcond = lu.rcond();
  require_nonsingular(fit.rcond, S, p.name);
  MatrixXd C = lu.solve(p.Q(R, Eigen::all).transpose()).transpose();

  // Every product here is r×r or larger (B is r×n): they run on the dispatched kernel
  // (kernel/matmul.hpp), not at the SSE2 speed Eigen has in a build without -march.
  const auto mul = [](const auto& a, const auto& b) { return bd::kernel::matmul(a, b); };
  const MatrixXd USt = US.transpose();
  const MatrixXd B = mul(US, MatrixXd(p.V.transpose()));
  fit.B = rounded_in_double<Scalar>(B);
  require_representable<Scalar>(fit.B, "basis", p.name);
  const bool exact_basis = std::is_same_v<Scalar, double>;
  MatrixXd dBV = MatrixXd::Zero(p.r(), p.r()), dBdBt = MatrixXd::Zero(p.r(), p.r());
  MatrixXd dB;
  if (!exact_basis) {
    dB = fit.B - B;
    dBV = mul(dB, p.V);
    dBdBt = mul(dB, MatrixXd(dB.transpose()));
  }

  if (refit) {
    const MatrixXd D = UR - mul(C, US);
    const MatrixXd GUSt = mul(p.G, USt), dBVt = dBV.transpose();
    const MatrixXd BBt = mul(US, GUSt) + mul(US, dBVt) + mul(dBV, USt) + dBdBt;
    const MatrixXd rhs = mul(D, MatrixXd(GUSt + dBVt)) - mul(C, MatrixXd(mul(dBV, USt) + dBdBt));
    Eigen::LDLT<MatrixXd> ldlt(BBt);
    // A dependent basis (rank-deficient V) leaves B̂B̂ᵀ singular: the unrefitted C is then kept.
    if (ldlt.info() == Eigen::Success && ldlt.isPositive() && ldlt.rcond() > 1e-13) {
      C += ldlt.solve(rhs.transpose()).transpose();
      fit.refitted = true;
    }
  }

  fit.C = rounded_in_double<Scalar>(C);
  require_representable<Scalar>(fit.C, "coefficient matrix", p.name);
  const MatrixXd Dh = UR - mul(fit.C, US), Ct = fit.C.transpose();
  double e2 = mul(MatrixXd(Dh.transpose()), Dh).cwiseProduct(p.G).sum();
  if (!exact_basis) {
    e2 += -2 * mul(Ct, Dh).cwiseProduct(dBV).sum() + mul(Ct, fit.C).cwiseProduct(dBdBt).sum() + dB.squaredNorm();
  }
  fit.residual2 = std::max(0.0, e2);
  fit.S = std::move(S);
  return fit;
}

/// The same for a dense W (row form): B = W_S exactly, C by least squares against round(B)
/// (or B when refit is off), residual computed on W itself.
template <typename Scalar>
BasisFit fit_basis_dense(const Eigen::MatrixXd& W, const FactoredProduct& p, std::vector<Index> S, bool refit) {
  using Eigen::MatrixXd;
  BasisFit fit;
  const std::vector<Index> R = complement(S, W.rows());
  Eigen::PartialPivLU<MatrixXd> lu(MatrixXd(p.Q(S, Eigen::all)));
  fit.rcond = lu.rcond();
  require_nonsingular(fit.rcond, S, p.name);

  const MatrixXd B = W(S, Eigen::all);
  fit.B = rounded_in_double<Scalar>(B);
  require_representable<Scalar>(fit.B, "basis", p.name);
  const MatrixXd WR = W(R, Eigen::all);
  Eigen::ColPivHouseholderQR<MatrixXd> qr(MatrixXd(refit ? fit.B : B).transpose());
  fit.C = rounded_in_double<Scalar>(MatrixXd(qr.solve(WR.transpose()).transpose()));
  fit.refitted = refit;
  require_representable<Scalar>(fit.C, "coefficient matrix", p.name);
  fit.residual2 = (WR - fit.C * fit.B).squaredNorm() + (B - fit.B).squaredNorm();
  fit.S = std::move(S);
  return fit;
}

}  // namespace bd::detail
