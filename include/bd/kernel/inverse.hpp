// bd/kernel/inverse.hpp — explicit inverses of small factored matrices, on the CPU's vectors.
//
// Preparation inverts r×r blocks (r = d_h, 64…192): the basis block Q_S for C = Q_R·Q_S⁻¹,
// the Gram B̂B̂ᵀ of the refit, R of the Cholesky QR, and ranking's window blocks. Eigen's solve
// against an identity treats the identity as a dense right-hand side (2r³ flops at the build's
// SIMD width, SSE2 without -march). A triangular inverse is r³/6 multiply-adds by forward
// substitution against the identity, row by row, each row of L⁻¹ a combination of the rows
// above it (micro_kernel_simd.inc's lower_inverse_rows, along AVX-512 or AVX2 vectors); an
// inverse from an LU is U⁻¹·L⁻¹ (the product on the dispatched GEMM, matmul.hpp), from a
// Cholesky factor L⁻ᵀ·L⁻¹ (a Gram). Both are as accurate as the triangular solves.
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

#include "bd/base/error.hpp"
#include "bd/base/workspace.hpp"
#include "bd/kernel/dispatch.hpp"
#include "bd/kernel/matmul.hpp"

namespace bd::kernel {

namespace detail {
template <typename T>
using Dense = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;

/// A thread's scratch for the inverses below, in its Workspace: the triangular inverse's rows,
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

}  // namespace detail

namespace detail {
/// The dispatch of lower_inverse_into, one per scalar type: L read through (row, column) strides.
template <typename T>
void lower_inverse_rows(const T* l, Index rs, Index cs, Index n, bool unit, T* work, Index ld, T* out, Index ldo) {
  on_active_kernel<T>([&](auto k) { k.lower_inverse_rows(l, rs, cs, n, unit, work, ld, out, ldo); });
}
}  // namespace detail

/// out = L⁻¹ for a lower-triangular L (Mode: Eigen::Lower or Eigen::UnitLower), float or double,
/// either storage order (a transposed operand is read in place); the strictly upper part of L
/// is not read, out's is zero. `out` is resized to L's shape and must not alias L.
template <int Mode = Eigen::Lower, typename Derived>
void lower_inverse_into(const Eigen::MatrixBase<Derived>& L, detail::Dense<typename Derived::Scalar>& out,
                        Workspace& ws = default_workspace()) {
  static_assert(Mode == Eigen::Lower || Mode == Eigen::UnitLower, "lower_inverse_into: Eigen::Lower or Eigen::UnitLower");
  using T = typename Derived::Scalar;
  const Index n = L.rows();
  if (L.cols() != n)
    throw ShapeError(bd::detail::message("lower_inverse_into: L is ", n, "x", L.cols(), ", expected a square matrix"));
  detail::Dense<T> storage;
  const detail::Operand<T> l = detail::operand(L, storage);
  out.resize(n, n);
  if (n == 0) return;
  const Index ld = (n + 15) / 16 * 16;  // whole vectors of any instruction set
  T* work = detail::InverseScratch<T>::view(ws.local<detail::InverseScratch<T>>().work, n + 4, ld).data();
  const Index rs = l.row_major ? l.ld : 1, cs = l.row_major ? 1 : l.ld;
  const bool unit = Mode == Eigen::UnitLower;
  detail::lower_inverse_rows<T>(l.data, rs, cs, n, unit, work, ld, out.data(), out.outerStride());
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

/// The instantiations bd::compiled holds (src/compiled_kernel.cpp), extern under BD_COMPILED_LIB.
#define BD_INVERSE_INSTANTIATIONS(prefix)                                                                                   \
  prefix void detail::lower_inverse_rows<float>(const float*, Index, Index, Index, bool, float*, Index, float*, Index);       \
  prefix void detail::lower_inverse_rows<double>(const double*, Index, Index, Index, bool, double*, Index, double*, Index);
#ifdef BD_COMPILED_LIB
BD_INVERSE_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::kernel
