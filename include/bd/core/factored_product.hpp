// bd/core/factored_product.hpp — a product W = U·Vᵀ held through its factors, in row form.
//
// Everything a candidate basis needs is precomputed once per product, so that ranking a window
// costs one r×r factorisation and never touches the m×n product:
//   Q      orthonormal basis of range(U): for any basis rows S, C = U_R·U_S⁻¹ = Q_R·Q_S⁻¹;
//   G      VᵀV, so ‖W_i‖² = U_i·G·U_iᵀ and every exact residual reduces to r×r Gram matrices;
//   ΩᵀQ    a Gaussian sketch of Q, used to rank windows (see basis_selection.hpp).
// The column form is the row form of Wᵀ = V·Uᵀ; callers swap U and V.
#pragma once

#include <cmath>
#include <random>
#include <string>

#include <Eigen/Cholesky>
#include <Eigen/Core>
#include <Eigen/Eigenvalues>
#include <Eigen/QR>

#include "bd/core/error.hpp"
#include "bd/core/options.hpp"
#include "bd/kernel/inverse.hpp"
#include "bd/kernel/matmul.hpp"

namespace bd::detail {

struct FactoredProduct {
  Eigen::MatrixXd U;          ///< m×r, the factor on the basis side
  Eigen::MatrixXd V;          ///< n×r
  Eigen::MatrixXf Vf;         ///< n×r, V rounded to float when Grams or B are formed in fp32 (else empty)
  Eigen::MatrixXd Q;          ///< m×r, orthonormal, range(Q) = range(U)
  Eigen::MatrixXd G;          ///< r×r, VᵀV
  Eigen::VectorXd row_norm2;  ///< ‖W_i,:‖² for every row i
  Eigen::MatrixXf Qt;         ///< r×m, Qᵀ in float: a window's Q_Sᵀ is a contiguous block (ranking)
  Eigen::MatrixXd sketch;     ///< k×r, ΩᵀQ with Ω an m×k standard Gaussian matrix
  Eigen::MatrixXf sketch_t;   ///< r×k, (ΩᵀQ)ᵀ in float
  Eigen::MatrixXd omega;      ///< m×k, Ω
  double norm2 = 0;           ///< ‖W‖²_F
  std::string name;           ///< how messages name this product ("head 3", "W")

  Index m() const { return U.rows(); }
  Index n() const { return V.rows(); }
  Index r() const { return U.cols(); }
};

/// AᵀA on the dispatched kernel (Aᵀ read in place), exactly symmetric, in double.
template <typename T>
Eigen::MatrixXd gram(const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>& A) {
  const Eigen::MatrixXd g = bd::kernel::matmul(A.transpose(), A).template cast<double>();
  return 0.5 * (g + g.transpose());
}

/// Q with range(Q) = range(U), QᵀQ = I, by Cholesky QR: UᵀU = RᵀR, Q = U·R⁻¹ (two GEMMs on the
/// dispatched kernel, where Householder QR would run level-2 code at the build's SIMD width).
/// One pass loses orthogonality as κ(U)²·u, so a second pass (CholeskyQR2, Fukaya et al. 2014)
/// follows when κ(U) > 10² and Q is then orthonormal to working precision. Returns false when
/// κ(U) > 10⁶ (UᵀU is then too ill-conditioned to factor): the caller uses Householder QR.
inline bool cholesky_qr(const Eigen::MatrixXd& U, Eigen::MatrixXd& Q) {
  Q = U;
  for (int pass = 0; pass < 2; ++pass) {
    const Eigen::LLT<Eigen::MatrixXd> llt(gram(Q));
    if (llt.info() != Eigen::Success) return false;
    const double rcond = llt.rcond();  // ≈ 1/κ(Q)²
    if (pass == 0 && !(rcond > 1e-12)) return false;
    const Eigen::MatrixXd Rinv = bd::kernel::lower_inverse(llt.matrixLLT()).transpose();  // R = Lᵀ
    Q = bd::kernel::matmul(Q, Rinv);
    if (pass == 0 && rcond > 1e-4) break;
  }
  return true;
}

/// Precomputes a product's invariants. Throws SingularBasisError when U is rank-deficient:
/// then every r rows of W are dependent and no basis exists (a zero or pruned head).
/// A rank-deficient V is allowed: W_R = (U_R·U_S⁻¹)·(U_S·Vᵀ) holds for any V.
/// `fp32_gram`: G = VᵀV formed in float (see coefficient_fit.hpp for why that is safe).
inline FactoredProduct factor_product(Eigen::MatrixXd U, Eigen::MatrixXd V, const Options& opts, std::string name,
                                      bool fp32_gram = false) {
  FactoredProduct p;
  p.name = std::move(name);
  const Index m = U.rows(), r = U.cols();

  if (!cholesky_qr(U, p.Q)) {
    Eigen::ColPivHouseholderQR<Eigen::MatrixXd> qr(U);
    if (qr.rank() < r)
      throw SingularBasisError(message(p.name, ": the basis-side factor (", m, "x", r, ") has numerical rank ", qr.rank(),
                                       " < r = ", r, ", so every choice of ", r,
                                       " basis rows is singular (a zero, pruned or tied head?); leave it dense "
                                       "or use a smaller rank"));
    p.Q = qr.householderQ() * Eigen::MatrixXd::Identity(m, r);
  }

  if (fp32_gram) {
    p.Vf = V.cast<float>();
    p.G = gram(p.Vf);
  } else {
    p.G = gram(V);
  }
  p.row_norm2 = (bd::kernel::matmul(U, p.G).array() * U.array()).rowwise().sum().max(0.0);
  p.norm2 = p.row_norm2.sum();

  const Index k = std::max<Index>(1, opts.sketch_columns);
  std::mt19937_64 rng(opts.seed);
  std::normal_distribution<double> normal;
  p.omega = Eigen::MatrixXd::NullaryExpr(m, k, [&]() { return normal(rng); });
  p.sketch = p.omega.transpose() * p.Q;
  p.Qt = p.Q.transpose().cast<float>();
  p.sketch_t = p.sketch.transpose().cast<float>();

  p.U = std::move(U);
  p.V = std::move(V);
  return p;
}

/// Rows of W are isometric to the rows of the returned m×r matrix F: W_i·W_jᵀ = F_i·F_jᵀ.
/// With VᵀV = E·Λ·Eᵀ (symmetric eigendecomposition; Λ ≥ 0 also when V is rank-deficient),
/// F = U·E·Λ^½. Used to pivot in W's own geometry without forming W.
inline Eigen::MatrixXd row_geometry(const FactoredProduct& p) {
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(p.G);
  const Eigen::VectorXd scale = eig.eigenvalues().array().max(0.0).sqrt();
  return (p.U * eig.eigenvectors()) * scale.asDiagonal();
}

}  // namespace bd::detail
