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
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "bd/base/deferred.hpp"
#include "bd/base/error.hpp"
#include "bd/base/random.hpp"
#include "bd/base/workspace.hpp"
#include "bd/core/options.hpp"
#include "bd/kernel/cholesky.hpp"
#include "bd/kernel/householder_qr.hpp"
#include "bd/kernel/inverse.hpp"
#include "bd/kernel/matmul.hpp"

/// The ranking stage, public for those who test or extend it: a product factored for ranking
/// (this file), the candidate windows and a window's score (basis_selection.hpp), auto's screen
/// (strategy.hpp). The rest of preparation is bd::detail's.
namespace bd::ranking {

struct FactoredProduct {
  Eigen::MatrixXd U;          ///< m×r, the factor on the basis side
  Eigen::MatrixXd V;          ///< n×r in double, when a product needs it (else empty)
  Eigen::MatrixXf Vf_owned;   ///< n×r, V rounded to float when Grams or B are formed in fp32 (else empty)
  const Eigen::MatrixXf* Vf_borrowed = nullptr;  ///< the caller's own float V, read in place instead
  /// V in float (see Vf_owned / Vf_borrowed; empty when neither is held).
  const Eigen::MatrixXf& Vf() const { return Vf_borrowed ? *Vf_borrowed : Vf_owned; }
  Eigen::MatrixXd Q;          ///< m×r, orthonormal, range(Q) = range(U)
  Eigen::MatrixXd G;          ///< r×r, VᵀV
  Eigen::VectorXd row_norm2;  ///< ‖W_i,:‖² for every row i
  Eigen::MatrixXf Qf;         ///< m×r, Q in float (ranking): row i of Q_Sᵀ is a contiguous run of column i
  Eigen::MatrixXd sketch;     ///< k×r, ΩᵀQ with Ω an m×k standard Gaussian matrix
  Eigen::MatrixXf sketch_t;   ///< r×k, (ΩᵀQ)ᵀ in float
  std::shared_ptr<const Eigen::MatrixXd> omega;  ///< m×k, Ω (one for every product of a call)
  double norm2 = 0;           ///< ‖W‖²_F
  std::string name;           ///< how messages name this product ("head 3", "W")

  Index m() const { return U.rows(); }
  Index n() const { return V.size() ? V.rows() : Vf().rows(); }
  Index r() const { return U.cols(); }
  /// Rows J of V in double (from Vf when only the float copy is held).
  Eigen::MatrixXd V_rows(const std::vector<Index>& J) const {
    return V.size() ? Eigen::MatrixXd(V(J, Eigen::all)) : Eigen::MatrixXd(Vf()(J, Eigen::all).template cast<double>());
  }
};

/// Ω, the m×k standard Gaussian sketch that ranks windows: drawn once per preparation from
/// Options::seed (every product of a call shares it), so preparation is reproducible.
BD_DEFERRED std::shared_ptr<const Eigen::MatrixXd> sketch_matrix(Index m, const Options& opts) {
  const Index k = std::max<Index>(1, opts.sketch_columns);
  Random rng(opts.seed);
  auto omega = std::make_shared<Eigen::MatrixXd>(m, k);
  for (Index j = 0; j < k; ++j)
    for (Index i = 0; i < m; ++i) (*omega)(i, j) = rng.normal();
  return omega;
}

/// A thread's scratch for factoring products (in the preparation's Workspace): the Cholesky
/// QR's Gram, its factor and inverse, the first pass's Q; the float Gram and U·G of the row norms.
struct FactorScratch {
  Eigen::MatrixXd gram, Linv, previous;
  bd::kernel::Cholesky<double> llt;
  Eigen::MatrixXf Gf, Uf, UG;
};

/// Q with range(Q) = range(U), QᵀQ = I, by Cholesky QR: UᵀU = RᵀR, Q = U·R⁻¹ (two GEMMs on the
/// dispatched kernel, where Householder QR would run level-2 code at the build's SIMD width).
/// One pass loses orthogonality as κ(U)²·u, so a second pass (CholeskyQR2, Fukaya et al. 2014)
/// follows when κ(U) > 10² and Q is then orthonormal to working precision. Returns false when
/// κ(U) > 10⁶ (UᵀU is then too ill-conditioned to factor): the caller uses Householder QR.
BD_DEFERRED bool cholesky_qr(const Eigen::MatrixXd& U, Eigen::MatrixXd& Q, Workspace& ws) {
  FactorScratch& scratch = ws.local<FactorScratch>();
  Eigen::MatrixXd &gram = scratch.gram, &Linv = scratch.Linv, &previous = scratch.previous;
  bd::kernel::Cholesky<double>& llt = scratch.llt;
  const Index r = U.cols();
  gram.resize(r, r);
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) previous = Q;
    const Eigen::MatrixXd& in = pass == 0 ? U : previous;
    bd::kernel::gram_into(in, gram, ws);
    llt.compute(gram, ws);
    if (!llt.ok()) return false;
    const double rcond = llt.rcond();  // ≈ 1/κ(Q)²
    if (pass == 0 && !(rcond > 1e-12)) return false;
    bd::kernel::lower_inverse_into(llt.matrixL(), Linv, ws);  // R⁻¹ = L⁻ᵀ (R = Lᵀ), read transposed
    Q.resize(in.rows(), r);
    bd::kernel::matmul_upper_into(in, Linv.transpose(), Q, ws);
    if (pass == 0 && rcond > 1e-4) break;
  }
  return true;
}

/// (A ∘ B)·1, the dot products of A's and B's rows, column by column: along the vectors of a
/// column-major matrix (Eigen's rowwise().sum() of the product walks each row across columns).
template <typename T>
Eigen::Matrix<T, Eigen::Dynamic, 1> row_dots(const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>& A,
                                             const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>& B) {
  Eigen::Matrix<T, Eigen::Dynamic, 1> sum = Eigen::Matrix<T, Eigen::Dynamic, 1>::Zero(A.rows());
  for (Index k = 0; k < A.cols(); ++k) sum += A.col(k).cwiseProduct(B.col(k));
  return sum;
}

/// Precomputes a product's invariants from the factors already in p (U, and V in double, in
/// float — owned or borrowed — or both), in place: a product reused for another of the same
/// shape keeps its storage. Throws SingularBasisError when U is rank-deficient: then every r
/// rows of W are dependent and no basis exists (a zero or pruned head). A rank-deficient V is
/// allowed: W_R = (U_R·U_S⁻¹)·(U_S·Vᵀ) holds for any V. G = VᵀV is formed from the float V when
/// there is one (see coefficient_fit.hpp for why that is safe). p.omega is sketch_matrix(m, ·).
BD_DEFERRED void factor_in_place(FactoredProduct& p, Workspace& ws) {
  const Eigen::MatrixXd& U = p.U;
  const Index m = U.rows(), r = U.cols();
  if (!cholesky_qr(U, p.Q, ws)) {
    const Index rank = bd::kernel::householder_range(U, p.Q);
    if (rank < r)
      throw SingularBasisError(bd::detail::message(p.name, ": the basis-side factor (", m, "x", r, ") has numerical rank ", rank,
                                       " < r = ", r, ", so every choice of ", r,
                                       " basis rows is singular (a zero, pruned or tied head?); leave it dense "
                                       "or use a smaller rank"));
  }
  if (p.Vf().size()) {
    // G from float V is accurate to float's unit (coefficient_fit.hpp), so ‖W_i‖² = U_i·G·U_iᵀ
    // loses nothing more in float: rows summed in float, the total in double.
    FactorScratch& scratch = ws.local<FactorScratch>();
    Eigen::MatrixXf &Gf = scratch.Gf, &Uf = scratch.Uf, &UG = scratch.UG;
    Gf.resize(r, r), UG.resize(m, r);
    bd::kernel::gram_into(p.Vf(), Gf, ws);
    Uf = U.cast<float>();
    bd::kernel::matmul_into(Uf, Gf, UG, ws);
    p.G = Gf.cast<double>();
    p.row_norm2 = row_dots(UG, Uf).cwiseMax(0.0f).cast<double>();
  } else {
    p.G.resize(r, r);
    bd::kernel::gram_into(p.V, p.G, ws);
    p.row_norm2 = row_dots(bd::kernel::matmul(U, p.G, ws), U).cwiseMax(0.0);
  }
  p.norm2 = p.row_norm2.sum();
  // Qᵀ·Ω (r×k) rather than Ωᵀ·Q: a k-row product (k = 8) would fill half a micro-tile.
  const Eigen::MatrixXd sketch_t = bd::kernel::matmul(p.Q.transpose(), *p.omega, ws);
  p.sketch = sketch_t.transpose();
  p.Qf = p.Q.cast<float>();
  p.sketch_t = sketch_t.cast<float>();
}

/// A product factored for ranking from its factors (see factor_in_place): V in double, in float
/// (Vf, or `borrowed_Vf`: the caller's float V, which must outlive the product, read without a
/// copy), or both; `omega` is sketch_matrix(U.rows(), ·).
BD_DEFERRED FactoredProduct factor_product(Eigen::MatrixXd U, Eigen::MatrixXd V, Eigen::MatrixXf Vf, std::string name,
                                      std::shared_ptr<const Eigen::MatrixXd> omega,
                                      const Eigen::MatrixXf* borrowed_Vf = nullptr, Workspace& ws = default_workspace()) {
  FactoredProduct p;
  p.U = std::move(U);
  p.V = std::move(V);
  p.Vf_owned = std::move(Vf);
  p.Vf_borrowed = borrowed_Vf;
  p.name = std::move(name);
  p.omega = std::move(omega);
  factor_in_place(p, ws);
  return p;
}

/// A set's factored products, kept in the calling thread's Workspace so that the next set of
/// the same shapes (the next layer) reuses their storage instead of faulting in fresh pages.
struct FactoredSet {
  std::vector<FactoredProduct> products;
};

/// Fᵀ (r×m) into Ft, where the rows of the m×r matrix F are isometric to the rows of W:
/// W_i·W_jᵀ = F_i·F_jᵀ. With VᵀV = L·Lᵀ (Cholesky), F = U·L; when VᵀV is singular (a rank-deficient
/// V), with VᵀV ≈ E·Eᵀ (pivoted Cholesky, E r×k, k the rank of V), F = U·E. Used to pivot in W's
/// own geometry without forming W: pivoting reads only F·Fᵀ, which both forms equal. Formed as
/// Lᵀ·Uᵀ, so that each row of F is a contiguous column, as QR with column pivoting reads them.
/// The Cholesky factor and Lᵀ are the thread's GeometryScratch.
struct GeometryScratch {
  bd::kernel::Cholesky<double> llt;
  Eigen::MatrixXd Lt;
};

BD_DEFERRED void row_geometry_transposed(const FactoredProduct& p, Eigen::MatrixXd& Ft, Workspace& ws) {
  GeometryScratch& scratch = ws.local<GeometryScratch>();
  scratch.llt.compute(p.G, ws);
  Ft.resize(p.r(), p.m());
  if (scratch.llt.ok() && scratch.llt.rcond() > 1e-12) {
    scratch.Lt = scratch.llt.matrixL().transpose();
    bd::kernel::matmul_into(scratch.Lt, p.U.transpose(), Ft, ws);
    return;
  }
  // G singular (a rank-deficient V): G ≈ E·Eᵀ, E r×k by pivoted Cholesky, and F = U·E, padded
  // with zero columns to r: zero rows of Fᵀ, which add nothing to any row of W's norm or product.
  const Eigen::MatrixXd E = bd::kernel::semidefinite_factor(p.G);
  Ft.setZero();
  auto top = Ft.topRows(E.cols());
  bd::kernel::matmul_into(E.transpose(), p.U.transpose(), top, ws);
}

/// The instantiations bd::compiled holds (src/compiled_ranking.cpp).
#define BD_FACTORED_PRODUCT_INSTANTIATIONS(prefix)                                                                     \
  prefix std::shared_ptr<const Eigen::MatrixXd> sketch_matrix<>(Index, const Options&);                               \
  prefix bool cholesky_qr<>(const Eigen::MatrixXd&, Eigen::MatrixXd&, Workspace&);                                    \
  prefix void factor_in_place<>(FactoredProduct&, Workspace&);                                                        \
  prefix FactoredProduct factor_product<>(Eigen::MatrixXd, Eigen::MatrixXd, Eigen::MatrixXf, std::string,             \
                                          std::shared_ptr<const Eigen::MatrixXd>, const Eigen::MatrixXf*, Workspace&); \
  prefix void row_geometry_transposed<>(const FactoredProduct&, Eigen::MatrixXd&, Workspace&);
#ifdef BD_COMPILED_LIB
BD_FACTORED_PRODUCT_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::ranking

namespace bd::detail {
using namespace bd::ranking;  // preparation's stages call the ranking stage's pieces unqualified
}  // namespace bd::detail
