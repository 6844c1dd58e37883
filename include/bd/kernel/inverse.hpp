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

template <typename T>
using Dense = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;

template <int Mode, typename T>
Dense<T> lower_inverse_of(const Eigen::Ref<const Dense<T>>& L) {
  const Index n = L.rows();
  if (n <= inverse_leaf) return L.template triangularView<Mode>().solve(Dense<T>::Identity(n, n));
  const Index h = (n / 2 + 7) / 8 * 8;  // the split on a multiple of 8: whole SIMD columns
  Dense<T> out = Dense<T>::Zero(n, n);
  out.topLeftCorner(h, h) = lower_inverse_of<Mode, T>(L.topLeftCorner(h, h));
  out.bottomRightCorner(n - h, n - h) = lower_inverse_of<Mode, T>(L.bottomRightCorner(n - h, n - h));
  const Dense<T> BAi = matmul(L.bottomLeftCorner(n - h, h), out.topLeftCorner(h, h));
  auto lower_left = out.bottomLeftCorner(n - h, h);
  matmul_into(out.bottomRightCorner(n - h, n - h), BAi, lower_left);
  lower_left = -lower_left;
  return out;
}
}  // namespace detail

/// L⁻¹ for a lower-triangular L (Mode: Eigen::Lower or Eigen::UnitLower), float or double; the
/// strictly upper part of L is not read.
template <int Mode = Eigen::Lower, typename Derived>
detail::Dense<typename Derived::Scalar> lower_inverse(const Eigen::MatrixBase<Derived>& L) {
  using T = typename Derived::Scalar;
  return detail::lower_inverse_of<Mode, T>(L);
}

namespace detail {
/// A⁻¹ = U⁻¹·L⁻¹·P from P·A = L·U held column-major in one matrix (L unit lower, U upper);
/// column j of L⁻¹·P is column gather[j] of L⁻¹.
template <typename T, typename Gather>
Dense<T> inverse_from_lu(const Dense<T>& LU, const Gather& gather) {
  const Index n = LU.rows();
  const Dense<T> Linv = lower_inverse<Eigen::UnitLower>(LU);
  // U⁻¹ = ((Uᵀ)⁻¹)ᵀ, Uᵀ lower-triangular; the transpose is read in place by matmul.
  const Dense<T> UinvT = lower_inverse<Eigen::Lower>(LU.transpose());
  Dense<T> LinvP(n, n);
  for (Index j = 0; j < n; ++j) LinvP.col(j) = Linv.col(gather[j]);
  return matmul(UinvT.transpose(), LinvP);
}
}  // namespace detail

/// A⁻¹ from A's LU with partial pivoting (Eigen's), P·A = L·U:  A⁻¹ = U⁻¹·L⁻¹·P.
template <typename T>
detail::Dense<T> inverse(const Eigen::PartialPivLU<detail::Dense<T>>& lu) {
  return detail::inverse_from_lu<T>(lu.matrixLU(), lu.permutationP().indices());
}

/// A⁻¹ for a symmetric positive definite A from its Cholesky factor, A = L·Lᵀ: A⁻¹ = L⁻ᵀ·L⁻¹.
template <typename T>
detail::Dense<T> inverse(const Eigen::LLT<detail::Dense<T>>& llt) {
  const detail::Dense<T> Linv = lower_inverse<Eigen::Lower>(llt.matrixLLT());
  return gram(Linv);  // exactly symmetric
}

}  // namespace bd::kernel
