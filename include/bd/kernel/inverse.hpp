// bd/kernel/inverse.hpp — explicit inverses of small factored matrices, built on the GEMM.
//
// Preparation inverts r×r blocks (r = d_h, 64…192): the basis block Q_S for C = Q_R·Q_S⁻¹,
// the Gram B̂B̂ᵀ of the refit, R of the Cholesky QR. Eigen's solve against an identity treats
// the identity as a dense right-hand side (2r³ flops at the build's SIMD width, SSE2 without
// -march). A triangular inverse by 2×2 blocks,
//
//     [A 0; B C]⁻¹ = [A⁻¹ 0; −C⁻¹·B·A⁻¹  C⁻¹],
//
// needs r³/3 flops, nearly all in the two off-diagonal products, which run on the dispatched
// kernel (matmul.hpp). It is as accurate as the triangular solve: the same substitutions, in
// another order (Du Croz & Higham, 1992).
#pragma once

#include <Eigen/Cholesky>
#include <Eigen/Core>
#include <Eigen/LU>

#include "bd/kernel/matmul.hpp"

namespace bd::kernel {

namespace detail {
/// Blocks this small are inverted by Eigen's substitution directly.
inline constexpr Index inverse_leaf = 48;
}  // namespace detail

/// L⁻¹ for a lower-triangular L (Mode: Eigen::Lower or Eigen::UnitLower); the strictly upper
/// part of L is not read.
template <int Mode = Eigen::Lower>
Eigen::MatrixXd lower_inverse(const Eigen::Ref<const Eigen::MatrixXd>& L) {
  const Index n = L.rows();
  if (n <= detail::inverse_leaf)
    return L.template triangularView<Mode>().solve(Eigen::MatrixXd::Identity(n, n));
  const Index h = (n / 2 + 7) / 8 * 8;  // the split on a multiple of 8: whole SIMD columns
  Eigen::MatrixXd out = Eigen::MatrixXd::Zero(n, n);
  out.topLeftCorner(h, h) = lower_inverse<Mode>(L.topLeftCorner(h, h));
  out.bottomRightCorner(n - h, n - h) = lower_inverse<Mode>(L.bottomRightCorner(n - h, n - h));
  const Eigen::MatrixXd BAi = matmul(L.bottomLeftCorner(n - h, h), out.topLeftCorner(h, h));
  out.bottomLeftCorner(n - h, h) = -matmul(out.bottomRightCorner(n - h, n - h), BAi);
  return out;
}

/// A⁻¹ from A's LU with partial pivoting, A = P⁻¹·L·U:  A⁻¹ = U⁻¹·L⁻¹·P.
inline Eigen::MatrixXd inverse(const Eigen::PartialPivLU<Eigen::MatrixXd>& lu) {
  const Eigen::MatrixXd& LU = lu.matrixLU();
  const Eigen::MatrixXd Linv = lower_inverse<Eigen::UnitLower>(LU);
  // U⁻¹ = ((Uᵀ)⁻¹)ᵀ, Uᵀ lower-triangular.
  const Eigen::MatrixXd Uinv = lower_inverse<Eigen::Lower>(LU.transpose()).transpose();
  return matmul(Uinv, Linv) * lu.permutationP();
}

/// A⁻¹ for a symmetric positive definite A from its Cholesky factor, A = L·Lᵀ: A⁻¹ = L⁻ᵀ·L⁻¹.
inline Eigen::MatrixXd inverse(const Eigen::LLT<Eigen::MatrixXd>& llt) {
  const Eigen::MatrixXd Linv = lower_inverse<Eigen::Lower>(llt.matrixLLT());
  Eigen::MatrixXd out = matmul(Linv.transpose(), Linv);
  return 0.5 * (out + out.transpose());  // exactly symmetric
}

}  // namespace bd::kernel
