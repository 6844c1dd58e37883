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
//
// The `_into` forms write into the caller's matrix and keep their scratch in the caller's
// Workspace (InverseScratch): they run once or twice per product of a preparation, and a fresh
// r×r block each time would be a fresh mapping, faulted in and zeroed (r = 128 in double is
// glibc's 128 KiB mmap threshold).
#pragma once

#include <vector>

#include <Eigen/Cholesky>
#include <Eigen/Core>
#include <Eigen/LU>

#include "bd/base/workspace.hpp"
#include "bd/kernel/matmul.hpp"

namespace bd::kernel {

namespace detail {
/// Blocks this small are inverted by Eigen's substitution directly (its substitution runs at
/// the build's SIMD width: r = 128 inverts in 30 µs in float with leaves of ≤ 24, 35 µs with
/// ≤ 48, 99 µs unblocked, measured on Zen 4 in the default build).
inline constexpr Index inverse_leaf = 24;

template <typename T>
using Dense = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;

/// A thread's scratch for the inverses below, in its Workspace: the recursion's work block,
/// the two triangular inverses of an LU and their product (contents not kept between calls).
template <typename T>
struct InverseScratch {
  std::vector<T> work, product;
  Dense<T> Linv, UinvT;

  static Eigen::Map<Dense<T>> view(std::vector<T>& storage, Index rows, Index cols) {
    if (storage.size() < static_cast<std::size_t>(rows * cols)) storage.resize(static_cast<std::size_t>(rows * cols));
    return Eigen::Map<Dense<T>>(storage.data(), rows, cols);
  }
};

/// A read-only block of either storage order, viewed without a copy (one type per order, so
/// that the recursion below instantiates once).
template <typename T, int Order>
using ConstBlock = Eigen::Ref<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Order>, 0, Eigen::OuterStride<>>;

/// out = L⁻¹ (n×n, column-major, any leading dimension), the strict upper part zero. `work`
/// holds at least (n − n/2)·(n/2 + 8) values: each level's −C⁻¹·B·A⁻¹ passes through it after
/// its halves are done.
template <int Mode, typename T, int Order>
void lower_inverse_blocks(const ConstBlock<T, Order>& L, Eigen::Ref<Dense<T>, 0, Eigen::OuterStride<>> out, T* work,
                          Workspace& ws) {
  const Index n = L.rows();
  if (n <= inverse_leaf) {
    out.setIdentity();
    L.template triangularView<Mode>().solveInPlace(out);
    return;
  }
  const Index h = (n / 2 + 7) / 8 * 8;  // the split on a multiple of 8: whole SIMD columns
  lower_inverse_blocks<Mode, T, Order>(L.topLeftCorner(h, h), out.topLeftCorner(h, h), work, ws);
  lower_inverse_blocks<Mode, T, Order>(L.bottomRightCorner(n - h, n - h), out.bottomRightCorner(n - h, n - h), work, ws);
  out.topRightCorner(h, n - h).setZero();
  Eigen::Map<Dense<T>> BAi(work, n - h, h);
  matmul_into(L.bottomLeftCorner(n - h, h), out.topLeftCorner(h, h), BAi, ws);
  auto lower_left = out.bottomLeftCorner(n - h, h);
  matmul_into(out.bottomRightCorner(n - h, n - h), BAi, lower_left, ws);
  lower_left = -lower_left;
}
}  // namespace detail

/// out = L⁻¹ for a lower-triangular L (Mode: Eigen::Lower or Eigen::UnitLower), float or double;
/// the strictly upper part of L is not read. `out` is resized to L's shape.
template <int Mode = Eigen::Lower, typename Derived>
void lower_inverse_into(const Eigen::MatrixBase<Derived>& L, detail::Dense<typename Derived::Scalar>& out,
                        Workspace& ws = default_workspace()) {
  using T = typename Derived::Scalar;
  const Index n = L.rows();
  out.resize(n, n);
  auto work = detail::InverseScratch<T>::view(ws.local<detail::InverseScratch<T>>().work, n - n / 2, n / 2 + 8);
  constexpr int order = Derived::IsRowMajor ? Eigen::RowMajor : Eigen::ColMajor;
  detail::lower_inverse_blocks<Mode, T, order>(L, out, work.data(), ws);
}

/// L⁻¹ as a new matrix (see lower_inverse_into).
template <int Mode = Eigen::Lower, typename Derived>
detail::Dense<typename Derived::Scalar> lower_inverse(const Eigen::MatrixBase<Derived>& L,
                                                      Workspace& ws = default_workspace()) {
  detail::Dense<typename Derived::Scalar> out;
  lower_inverse_into<Mode>(L, out, ws);
  return out;
}

/// out = A⁻¹ = U⁻¹·L⁻¹·P from P·A = L·U held in one matrix `LU` (any storage order; L unit
/// lower, U upper); column j of A⁻¹ is column gather[j] of U⁻¹·L⁻¹.
template <typename DerivedLU, typename Gather>
void inverse_from_lu_into(const Eigen::MatrixBase<DerivedLU>& LU, const Gather& gather,
                          detail::Dense<typename DerivedLU::Scalar>& out, Workspace& ws = default_workspace()) {
  using T = typename DerivedLU::Scalar;
  auto& scratch = ws.local<detail::InverseScratch<T>>();
  detail::Dense<T>& Linv = scratch.Linv;
  detail::Dense<T>& UinvT = scratch.UinvT;
  const Index n = LU.rows();
  lower_inverse_into<Eigen::UnitLower>(LU, Linv, ws);
  // U⁻¹ = ((Uᵀ)⁻¹)ᵀ, Uᵀ lower-triangular; both transposes are read in place.
  lower_inverse_into<Eigen::Lower>(LU.transpose(), UinvT, ws);
  // U⁻¹·L⁻¹, on L⁻¹'s triangle (5/8 of the dense product)
  auto product = detail::InverseScratch<T>::view(scratch.product, n, n);
  matmul_lower_into(UinvT.transpose(), Linv, product, ws);
  out.resize(n, n);
  for (Index j = 0; j < n; ++j) out.col(j) = product.col(gather[j]);
}

/// A⁻¹ from A's LU with partial pivoting (Eigen's), P·A = L·U:  A⁻¹ = U⁻¹·L⁻¹·P.
template <typename T>
detail::Dense<T> inverse(const Eigen::PartialPivLU<detail::Dense<T>>& lu, Workspace& ws = default_workspace()) {
  detail::Dense<T> out;
  inverse_from_lu_into(lu.matrixLU(), lu.permutationP().indices(), out, ws);
  return out;
}

/// out = A⁻¹ for a symmetric positive definite A from its Cholesky factor, A = L·Lᵀ:
/// A⁻¹ = L⁻ᵀ·L⁻¹, exactly symmetric.
template <typename T>
void inverse_into(const Eigen::LLT<detail::Dense<T>>& llt, detail::Dense<T>& out, Workspace& ws = default_workspace()) {
  detail::Dense<T>& Linv = ws.local<detail::InverseScratch<T>>().Linv;
  lower_inverse_into<Eigen::Lower>(llt.matrixLLT(), Linv, ws);
  out.resize(Linv.rows(), Linv.cols());
  gram_into(Linv, out, ws);
}

/// A⁻¹ for a symmetric positive definite A as a new matrix (see inverse_into).
template <typename T>
detail::Dense<T> inverse(const Eigen::LLT<detail::Dense<T>>& llt, Workspace& ws = default_workspace()) {
  detail::Dense<T> out;
  inverse_into(llt, out, ws);
  return out;
}

}  // namespace bd::kernel
