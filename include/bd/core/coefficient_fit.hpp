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

#include <Eigen/QR>

#include "bd/core/basis_selection.hpp"
#include "bd/base/deferred.hpp"
#include "bd/base/error.hpp"
#include "bd/core/factored_product.hpp"
#include "bd/base/workspace.hpp"
#include "bd/core/phase_times.hpp"
#include "bd/core/precision.hpp"
#include "bd/core/scalar.hpp"
#include "bd/core/validate.hpp"
#include "bd/kernel/cholesky.hpp"
#include "bd/kernel/inverse.hpp"
#include "bd/kernel/matmul.hpp"
#include "bd/kernel/small_lu.hpp"

namespace bd::detail {

/// A fitted basis, stored: B and C rounded once to Scalar, oriented as the Decomposition holds
/// them (the maths below is in row form; the column form's B and C are its transposes).
template <typename Scalar>
struct BasisFit {
  using Matrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic>;
  std::vector<Index> S;
  Matrix B;  ///< row form r×n; column form n×r
  Matrix C;  ///< row form (m−r)×r; column form r×(m−r)
  double residual2 = 0;
  double rcond = 0;
  bool refitted = false;
};

template <typename Scalar>
void require_representable(const Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic>& rounded,
                           const std::string& what, const std::string& name) {
  if (!all_finite(rounded))
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

/// A thread's scratch for fit_basis, in the preparation's Workspace: B and ΔB (r×n or n×r; one block of basis_block entries
/// when B is formed in float), U_S, every (m−r)×r block (U_R, Q_R, C, Ĉ, D̂, [D̂ Ĉ] in float)
/// and every r×r one. A layer's products are
/// all one shape, so after a thread's first product nothing of this size is allocated again:
/// each of these blocks is at or over glibc's mmap threshold (128 KiB: an r×r double at r = 128),
/// and fresh ones would be faulted in, zeroed, for every product (13–17 % of DeepSeek-V2-Lite's
/// preparation, measured with the allocator told to keep them instead).
struct FitBuffers {
  Eigen::MatrixXf Bf, dBf, X, USf, dBVf, dBdBtf, dBVf_part, dBdBtf_part, XtX;
  Eigen::MatrixXd Bd, dB, US, UR, QR, C, Ct, Ch, Dh;
  Eigen::MatrixXd QSinv_t, dBV, dBdBt, GUSt, Y, BBt, inv, M, T;  // r×r
  bd::kernel::SmallLU<double> lu;    // of Q_Sᵀ
  bd::kernel::Cholesky<double> llt;  // of B̂B̂ᵀ
};

/// out = rows `list` (ascending) of A, copied run by run: a window's complement is two blocks,
/// each column of which is one contiguous copy (Eigen's indexed view reads element by element).
BD_DEFERRED void gather_rows(const Eigen::MatrixXd& A, const std::vector<Index>& list, Eigen::MatrixXd& out) {
  out.resize(static_cast<Index>(list.size()), A.cols());
  for (std::size_t k = 0; k < list.size();) {
    std::size_t end = k + 1;
    while (end < list.size() && list[end] == list[end - 1] + 1) ++end;
    const Index len = static_cast<Index>(end - k);
    out.middleRows(static_cast<Index>(k), len) = A.middleRows(list[k], len);
    k = end;
  }
}

/// ‖A‖²_F of a float matrix, summed in double: eight independent partial sums, so the loop
/// runs along vectors (Eigen's reduction of a cast expression runs one element at a time,
/// each add waiting on the last: half a millisecond for an r×n ΔB).
BD_DEFERRED double squared_norm_in_double(const Eigen::MatrixXf& a) {
  const float* p = a.data();
  const Index n = a.size();
  double acc[8] = {};
  Index i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += double(p[i + k]) * double(p[i + k]);
  for (; i < n; ++i) acc[0] += double(p[i]) * double(p[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/// Entries of B along n formed, rounded and differenced per block when B is formed in float:
/// a block of B, of ΔB and of V's rows (r = 128: 3 × 128 KiB) stays in a core's L2 (1 MiB and more on the CPUs bd meets).
inline constexpr Index basis_block = 256;

/// Above this reciprocal condition of Q_S, C = Q_R·Q_S⁻¹ computed in double is accurate to
/// ε₆₄/rcond ≤ 1e-10 relative: the refit may then leave out D = U_R − C·U_S (which only
/// corrects that double rounding), far below the 6e-8 of float storage.
inline constexpr double well_conditioned_rcond = 1e-6;

/// One fit in progress: the product and its basis, the thread's buffers and workspace, the
/// phase times and what the stages hand on; `precision` says which products run in float
/// (precision.hpp). The maths is in row form; `col` (the Decomposition's column form)
/// forms B transposed, Bᵀ = V·U_Sᵀ (n×r), so the stored result is written once in its own
/// orientation and ΔB·ΔBᵀ is the Gram of ΔBᵀ's columns. Products of r×r and larger run on the
/// dispatched kernel (kernel/matmul.hpp), not at the SSE2 speed Eigen has in a build without
/// -march; solves go through explicit r×r inverses so that their many right-hand sides become
/// products too.
template <typename Scalar>
struct FitStage {
  const FactoredProduct& p;
  const bool col;
  const Precision precision;
  Workspace& ws;
  FitBuffers& buf;
  PhaseTimes& times;
  BasisFit<Scalar> out;
  double dB2 = 0;  // ‖ΔB‖²
  static constexpr bool exact_basis = std::is_same_v<Scalar, double>;  // B̂ = B

  Index r() const { return p.r(); }
  bool grams_in_float() const { return detail::grams_in_float<Scalar>(precision); }
  bool basis_in_float() const { return detail::basis_in_float<Scalar>(precision); }

  /// B (or Bᵀ) from U_S and V's rows given: all of them, or one block of them.
  template <typename US, typename V, typename Out>
  void form_B(const US& us, const V& v, Out& b) const {
    if (col) b.resize(v.rows(), r()), kernel::matmul_into(v, us.transpose(), b, ws);
    else b.resize(r(), v.rows()), kernel::matmul_into(us, v.transpose(), b, ws);
  }
  /// ΔB·V and ΔB·ΔBᵀ from ΔB as held (ΔBᵀ in column form, read in place).
  template <typename DB, typename V, typename DBV, typename DBDBt>
  void delta_products(const DB& dB, const V& v, DBV& dBV, DBDBt& dBdBt) const {
    if (col) kernel::matmul_into(dB.transpose(), v, dBV, ws), kernel::gram_into(dB, dBdBt, ws);
    else kernel::matmul_into(dB, v, dBV, ws), kernel::gram_into(dB.transpose(), dBdBt, ws);
  }
};

/// Stage 1: U_S, U_R, Q_R gathered, and Q_S⁻¹ — Q_Sᵀ factored on the CPU's vectors
/// (kernel/small_lu.hpp: panel-blocked partial pivoting and Hager's rcond estimate), its storage
/// kept in the workspace; C = Q_R·Q_S⁻¹ later reads (Q_Sᵀ)⁻¹ transposed, in place.
template <typename Scalar>
void invert_basis_block(FitStage<Scalar>& f, const std::vector<Index>& S) {
  const std::vector<Index> R = complement(S, f.p.m());
  gather_rows(f.p.U, S, f.buf.US);
  gather_rows(f.p.U, R, f.buf.UR), gather_rows(f.p.Q, R, f.buf.QR);  // (m−r)×r, reused across products
  bd::kernel::SmallLU<double>& lu = f.buf.lu;
  if (is_window(S)) lu.compute(f.p.Q.middleRows(S.front(), f.r()).transpose());
  else lu.compute(f.p.Q(S, Eigen::all).transpose());
  f.out.rcond = lu.rcond();
  require_nonsingular(f.out.rcond, S, f.p.name);
  lu.inverse_into(f.buf.QSinv_t, f.ws);
}

/// Stage 2 with B formed in float (half and bfloat16, basis_in_float), in blocks of basis_block
/// entries along n (columns of B, rows of Bᵀ), each rounded to B̂ and differenced to ΔB while it
/// and V's rows are in L2; ΔB·V and ΔB·ΔBᵀ are summed block by block in float. Nothing r×n is
/// held but the stored B̂.
template <typename Scalar>
void form_basis_in_float_blocks(FitStage<Scalar>& f) {
  FitBuffers& buf = f.buf;
  const Index r = f.r(), n = f.p.n();
  buf.USf = buf.US.cast<float>();
  f.out.B.resize(f.col ? n : r, f.col ? r : n);
  buf.dBVf.setZero(r, r), buf.dBdBtf.setZero(r, r);
  buf.dBVf_part.resize(r, r), buf.dBdBtf_part.resize(r, r);
  for (Index j0 = 0; j0 < n; j0 += basis_block) {
    const Index w = std::min(basis_block, n - j0);
    const auto Vb = f.p.Vf().middleRows(j0, w);
    Eigen::MatrixXf& Bb = buf.Bf;
    {
      PhaseTimer timer(f.times.fit);
      f.form_B(buf.USf, Vb, Bb);
    }
    {
      PhaseTimer timer(f.times.round);
      // B̂ and B are floats within a factor 2 of each other: their difference is exact (Sterbenz).
      buf.dBf.resize(Bb.rows(), Bb.cols());
      const Index runs = f.col ? r : 1, run = f.col ? w : r * w;  // contiguous runs of the stored block
      for (Index c = 0; c < runs; ++c) {
        Scalar* stored = f.col ? &f.out.B(j0, c) : &f.out.B(0, j0);
        kernel::round_into(Bb.data() + c * run, run, stored);
        kernel::widen_into(stored, run, buf.dBf.data() + c * run);
      }
      buf.dBf -= Bb;
      f.dB2 += squared_norm_in_double(buf.dBf);
    }
    PhaseTimer timer(f.times.fit);
    f.delta_products(buf.dBf, Vb, buf.dBVf_part, buf.dBdBtf_part);
    buf.dBVf += buf.dBVf_part, buf.dBdBtf += buf.dBdBtf_part;
  }
}

/// Stage 2 with B formed in double, rounded once; ΔB kept in the type its Grams will be formed in.
template <typename Scalar>
void form_basis_in_double(FitStage<Scalar>& f) {
  FitBuffers& buf = f.buf;
  {
    PhaseTimer timer(f.times.fit);
    f.form_B(buf.US, f.p.V, buf.Bd);
  }
  PhaseTimer timer(f.times.round);
  const Eigen::MatrixXd& B = buf.Bd;
  f.out.B = round_matrix<Scalar>(B);
  if constexpr (std::is_same_v<Scalar, float>) {
    // One pass, no double temporary: float storage's ΔB is only read by the fp32 Grams.
    if (f.grams_in_float()) buf.dBf = (f.out.B.template cast<double>() - B).template cast<float>();
    else buf.dB = f.out.B.template cast<double>() - B;
  } else if constexpr (!FitStage<Scalar>::exact_basis) {
    buf.dB = values_as<double>(f.out.B) - B;
    if (f.grams_in_float()) buf.dBf = buf.dB.cast<float>();
  }
}

/// Stage 3: ΔB·V, ΔB·ΔBᵀ and ‖ΔB‖² in double, from whichever ΔB stage 2 left (zero for a
/// double basis, which is exact).
template <typename Scalar>
void delta_grams(FitStage<Scalar>& f) {
  FitBuffers& buf = f.buf;
  const Index r = f.r();
  buf.dBV.resize(r, r), buf.dBdBt.resize(r, r);
  if constexpr (FitStage<Scalar>::exact_basis) {
    buf.dBV.setZero(), buf.dBdBt.setZero();
  } else if (f.basis_in_float()) {  // summed by form_basis_in_float_blocks
    buf.dBV = buf.dBVf.cast<double>(), buf.dBdBt = buf.dBdBtf.cast<double>();
  } else if (f.grams_in_float()) {
    buf.dBVf.resize(r, r), buf.dBdBtf.resize(r, r);
    f.delta_products(buf.dBf, f.p.Vf(), buf.dBVf, buf.dBdBtf);
    buf.dBV = buf.dBVf.cast<double>(), buf.dBdBt = buf.dBdBtf.cast<double>();
    f.dB2 = squared_norm_in_double(buf.dBf);
  } else {
    f.delta_products(buf.dB, f.p.V, buf.dBV, buf.dBdBt);
    f.dB2 = buf.dB.squaredNorm();
  }
}

/// Stage 4: C = Q_R·Q_S⁻¹, refitted against the rounded basis when asked (and B̂ ≠ B). Normal
/// equations C'·B̂B̂ᵀ = U_R·Vᵀ·B̂ᵀ with B̂ = B + ΔB and C·U_S = U_R − D:
///   Y = ΔB·B̂ᵀ = ΔB·V·U_Sᵀ + ΔB·ΔBᵀ,   B̂B̂ᵀ = U_S·G·U_Sᵀ + Y + Yᵀ − ΔB·ΔBᵀ,
///   C' = C − C·Y·(B̂B̂ᵀ)⁻¹ + D·(G·U_Sᵀ + (ΔB·V)ᵀ)·(B̂B̂ᵀ)⁻¹.
/// Without D, C' = Q_R·Q_S⁻¹·(I − Y·(B̂B̂ᵀ)⁻¹): one (m−r)×r×r product for the whole fit. A
/// dependent basis (rank-deficient V) leaves B̂B̂ᵀ singular: the unrefitted C is then kept.
template <typename Scalar>
void fit_coefficients(FitStage<Scalar>& f, bool refit) {
  using Eigen::MatrixXd;
  FitBuffers& buf = f.buf;
  Workspace& ws = f.ws;
  const auto matmul_into = [&ws](const auto& a, const auto& b, auto& out) { kernel::matmul_into(a, b, out, ws); };
  const Index r = f.r();
  const auto QSinv = buf.QSinv_t.transpose();
  MatrixXd& C = buf.C;
  C.resize(buf.QR.rows(), r);
  if (FitStage<Scalar>::exact_basis || !refit) return matmul_into(buf.QR, QSinv, C);
  const auto USt = buf.US.transpose();
  MatrixXd &GUSt = buf.GUSt, &Y = buf.Y, &BBt = buf.BBt;
  GUSt.resize(r, r), Y.resize(r, r), BBt.resize(r, r);
  matmul_into(f.p.G, USt, GUSt);
  matmul_into(buf.dBV, USt, Y);
  Y += buf.dBdBt;
  matmul_into(buf.US, GUSt, BBt);
  BBt += Y + Y.transpose() - buf.dBdBt;
  bd::kernel::Cholesky<double>& llt = buf.llt;
  llt.compute(BBt, ws);
  if (!(llt.ok() && llt.rcond() > 1e-13)) return matmul_into(buf.QR, QSinv, C);
  MatrixXd &inv = buf.inv, &M = buf.M, &T = buf.T;
  llt.inverse_into(inv, ws);
  M.resize(r, r), T.resize(r, r);
  matmul_into(Y, inv, M);  // M = I − Y·(B̂B̂ᵀ)⁻¹
  M = -M;
  M.diagonal().array() += 1.0;
  matmul_into(QSinv, M, T);
  matmul_into(buf.QR, T, C);
  if (f.out.rcond < well_conditioned_rcond) {
    const MatrixXd D = buf.UR - bd::kernel::matmul(bd::kernel::matmul(buf.QR, QSinv, ws), buf.US, ws);
    C += bd::kernel::matmul(D, bd::kernel::matmul(MatrixXd(GUSt + buf.dBV.transpose()), inv, ws), ws);
  }
  f.out.refitted = true;
}

/// Stage 5: Ĉ = round(C), in the stored orientation, and Ĉ widened back to double in row form.
template <typename Scalar>
void round_coefficients(FitStage<Scalar>& f) {
  FitBuffers& buf = f.buf;
  if (f.col) buf.Ct = buf.C.transpose();
  f.out.C = round_matrix<Scalar>(f.col ? buf.Ct : buf.C);
  require_representable<Scalar>(f.out.C, "coefficient matrix", f.p.name);
  // Ĉ in double and in row form for the error (stage 6), whichever form is stored.
  Eigen::MatrixXd& widened = f.col ? buf.Ct : buf.Ch;
  widened.resize(f.out.C.rows(), f.out.C.cols());
  kernel::widen_into(f.out.C.data(), f.out.C.size(), widened.data());
  if (f.col) buf.Ch = buf.Ct.transpose();
}

/// Stage 6: ‖W − Ŵ‖² from Ĉ in row form ((m−r)×r, the column form's transposed back by stage 5):
/// with D̂ = U_R − Ĉ·U_S in double (it cancels to the size of the error), the header's
/// ⟨D̂ᵀD̂, G⟩ − 2⟨ĈᵀD̂, ΔB·V⟩ + ⟨ĈᵀĈ, ΔB·ΔBᵀ⟩ + ‖ΔB‖². Its Grams are in float when allowed: they
/// are already at the scale of the error, so float keeps 6 digits of it.
template <typename Scalar>
double exact_error(FitStage<Scalar>& f, const Eigen::MatrixXd& Chr) {
  using Eigen::MatrixXd;
  FitBuffers& buf = f.buf;
  Workspace& ws = f.ws;
  const Index r = f.r();
  const MatrixXd &G = f.p.G, &dBV = buf.dBV, &dBdBt = buf.dBdBt;
  MatrixXd& Dh = buf.Dh;
  Dh.resize(Chr.rows(), r);
  kernel::matmul_into(Chr, buf.US, Dh, ws);
  Dh = buf.UR - Dh;  // elementwise: reading and writing the same entry
  if constexpr (FitStage<Scalar>::exact_basis) {
    MatrixXd& DtD = buf.T;
    DtD.resize(r, r);
    kernel::gram_into(Dh, DtD, ws);
    return DtD.cwiseProduct(G).sum();
  } else if (f.grams_in_float()) {
    Eigen::MatrixXf &X = buf.X, &XtX = buf.XtX;
    X.resize(Dh.rows(), 2 * r);
    X << Dh.cast<float>(), Chr.cast<float>();
    XtX.resize(2 * r, 2 * r);
    kernel::gram_into(X, XtX, ws);  // [D̂ Ĉ]ᵀ[D̂ Ĉ]: D̂ᵀD̂, ĈᵀD̂ and ĈᵀĈ as its blocks
    return XtX.topLeftCorner(r, r).cast<double>().cwiseProduct(G).sum() -
           2 * XtX.bottomLeftCorner(r, r).cast<double>().cwiseProduct(dBV).sum() +
           XtX.bottomRightCorner(r, r).cast<double>().cwiseProduct(dBdBt).sum() + f.dB2;
  } else {
    MatrixXd &DtD = buf.T, &CtD = buf.M, &CtC = buf.inv;
    DtD.resize(r, r), CtD.resize(r, r), CtC.resize(r, r);
    kernel::gram_into(Dh, DtD, ws), kernel::matmul_into(Chr.transpose(), Dh, CtD, ws), kernel::gram_into(Chr, CtC, ws);
    return DtD.cwiseProduct(G).sum() - 2 * CtD.cwiseProduct(dBV).sum() + CtC.cwiseProduct(dBdBt).sum() + f.dB2;
  }
}

/// B and C for the basis rows S of p, rounded once to Scalar, with the exact error: the stages
/// above in order, each timed into `times` (thread-seconds of fit, round and error), its
/// products in the precision `precision` says (precision.hpp), its scratch in `ws`.
template <typename Scalar>
BasisFit<Scalar> fit_basis(const FactoredProduct& p, std::vector<Index> S, bool refit, Side side, Precision precision,
                           PhaseTimes& times, Workspace& ws) {
  FitStage<Scalar> f{p, side == Side::Col, precision, ws, ws.local<FitBuffers>(), times, {}};
  {
    PhaseTimer timer(times.fit);
    invert_basis_block(f, S);
  }
  if constexpr (fp32_basis_possible<Scalar>) {
    if (f.basis_in_float()) form_basis_in_float_blocks(f);
    else form_basis_in_double(f);
  } else {
    form_basis_in_double(f);
  }
  {
    PhaseTimer timer(times.round);
    require_representable<Scalar>(f.out.B, "basis", p.name);
  }
  {
    PhaseTimer timer(times.fit);
    delta_grams(f);
    fit_coefficients(f, refit);
  }
  {
    PhaseTimer timer(times.round);
    round_coefficients(f);
  }
  PhaseTimer timer(times.error);
  f.out.residual2 = std::max(0.0, exact_error(f, f.buf.Ch));
  f.out.S = std::move(S);
  return std::move(f.out);
}

/// The reciprocal condition of the basis block Q_S of a dense W's factoring, refused when singular.
BD_DEFERRED double dense_basis_rcond(const FactoredProduct& p, const std::vector<Index>& S) {
  const bd::kernel::SmallLU<double> lu(p.Q(S, Eigen::all));
  const double rcond = lu.rcond();
  require_nonsingular(rcond, S, p.name);
  return rcond;
}

/// C with C·B ≈ W_R in least squares (column-pivoted QR of Bᵀ), for any stored type's basis.
BD_DEFERRED Eigen::MatrixXd least_squares_coefficients(const Eigen::MatrixXd& B, const Eigen::MatrixXd& WR) {
  Eigen::ColPivHouseholderQR<Eigen::MatrixXd> qr(B.transpose());
  return qr.solve(WR.transpose()).transpose();
}

/// The same for a dense W (W in row form; B and C stored as `side` holds them): B = W_S exactly,
/// C by least squares against round(B) (or B when refit is off), residual computed on W itself.
template <typename Scalar>
BasisFit<Scalar> fit_basis_dense(const Eigen::MatrixXd& W, const FactoredProduct& p, std::vector<Index> S, bool refit,
                                 Side side, PhaseTimes& times) {
  using Eigen::MatrixXd;
  BasisFit<Scalar> fit;
  const std::vector<Index> R = complement(S, W.rows());
  const MatrixXd B = W(S, Eigen::all), WR = W(R, Eigen::all);
  {
    PhaseTimer timer(times.fit);
    fit.rcond = dense_basis_rcond(p, S);
  }
  MatrixXd Bh, C;
  {
    PhaseTimer timer(times.round);
    fit.B = round_matrix<Scalar>(B);
    require_representable<Scalar>(fit.B, "basis", p.name);
    Bh = values_as<double>(fit.B);
  }
  {
    PhaseTimer timer(times.fit);
    C = least_squares_coefficients(refit ? Bh : B, WR);
  }
  {
    PhaseTimer timer(times.round);
    fit.C = round_matrix<Scalar>(C);
    fit.refitted = refit;
    require_representable<Scalar>(fit.C, "coefficient matrix", p.name);
  }
  PhaseTimer timer(times.error);
  fit.residual2 = (WR - values_as<double>(fit.C) * Bh).squaredNorm() + (B - Bh).squaredNorm();
  if (side == Side::Col) fit.B.transposeInPlace(), fit.C.transposeInPlace();
  fit.S = std::move(S);
  return fit;
}

/// The instantiations bd::compiled holds (src/compiled_ranking.cpp).
#define BD_COEFFICIENT_FIT_INSTANTIATIONS(prefix)                                                   \
  prefix void gather_rows<>(const Eigen::MatrixXd&, const std::vector<Index>&, Eigen::MatrixXd&);  \
  prefix double squared_norm_in_double<>(const Eigen::MatrixXf&);                                  \
  prefix double dense_basis_rcond<>(const FactoredProduct&, const std::vector<Index>&);             \
  prefix Eigen::MatrixXd least_squares_coefficients<>(const Eigen::MatrixXd&, const Eigen::MatrixXd&);
#ifdef BD_COMPILED_LIB
BD_COEFFICIENT_FIT_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::detail

namespace bd {

/// Entries of B along n formed, rounded and differenced together when B is formed in float
/// (half and bfloat16 storage): results do not depend on it, timings do.
inline constexpr Index basis_block = detail::basis_block;

}  // namespace bd
