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
#include "bd/base/error.hpp"
#include "bd/core/factored_product.hpp"
#include "bd/core/phase_times.hpp"
#include "bd/core/scalar.hpp"
#include "bd/core/validate.hpp"
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

/// Which products may run in float. Stored values never lose their fp64 preparation except B
/// for half and bfloat16 (the bound is in the header comment); the Grams only enter the
/// refit's correction and the error figure.
struct ProductPrecision {
  bool fp32_grams = false;  ///< G = VᵀV, ΔB·V, ΔB·ΔBᵀ
  bool fp32_basis = false;  ///< B = U_S·Vᵀ
};

template <typename Scalar>
ProductPrecision product_precision(bool allowed) {
  const bool narrow = std::is_same_v<Scalar, Eigen::half> || std::is_same_v<Scalar, Eigen::bfloat16>;
  return {allowed && !std::is_same_v<Scalar, double>, allowed && narrow};
}

/// Per-thread scratch of fit_basis: B and ΔB (r×n or n×r; one block of basis_block entries
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
};

inline FitBuffers& fit_buffers() {
  thread_local FitBuffers buffers;
  return buffers;
}

/// out = rows `list` (ascending) of A, copied run by run: a window's complement is two blocks,
/// each column of which is one contiguous copy (Eigen's indexed view reads element by element).
inline void gather_rows(const Eigen::MatrixXd& A, const std::vector<Index>& list, Eigen::MatrixXd& out) {
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
inline double squared_norm_in_double(const Eigen::MatrixXf& a) {
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
/// a block of B, of ΔB and of V's rows (r = 128: 3 × 128 KiB) stays in a core's L2 (1 MiB on Zen 4).
inline constexpr Index basis_block = 256;

/// Above this reciprocal condition of Q_S, C = Q_R·Q_S⁻¹ computed in double is accurate to
/// ε₆₄/rcond ≤ 1e-10 relative: the refit may then leave out D = U_R − C·U_S (which only
/// corrects that double rounding), far below the 6e-8 of float storage.
inline constexpr double well_conditioned_rcond = 1e-6;

/// One fit in progress: the product and its basis, the thread's buffers, the phase clock and
/// what the stages hand on. The maths is in row form; `col` (the Decomposition's column form)
/// forms B transposed, Bᵀ = V·U_Sᵀ (n×r), so the stored result is written once in its own
/// orientation and ΔB·ΔBᵀ is the Gram of ΔBᵀ's columns. Products of r×r and larger run on the
/// dispatched kernel (kernel/matmul.hpp), not at the SSE2 speed Eigen has in a build without
/// -march; solves go through explicit r×r inverses so that their many right-hand sides become
/// products too.
template <typename Scalar>
struct FitStage {
  const FactoredProduct& p;
  const bool col;
  const ProductPrecision precision;
  FitBuffers& buf;
  PhaseTimes& times;
  Stopwatch clock;
  BasisFit<Scalar> out;
  double dB2 = 0;                // ‖ΔB‖²
  bool formed_in_float = false;  // B formed in float blocks, ΔB·V and ΔB·ΔBᵀ summed in float
  static constexpr bool exact_basis = std::is_same_v<Scalar, double>;  // B̂ = B

  Index r() const { return p.r(); }

  /// B (or Bᵀ) from U_S and V's rows given: all of them, or one block of them.
  template <typename US, typename V, typename Out>
  void form_B(const US& us, const V& v, Out& b) const {
    if (col) b.resize(v.rows(), r()), kernel::matmul_into(v, us.transpose(), b);
    else b.resize(r(), v.rows()), kernel::matmul_into(us, v.transpose(), b);
  }
  /// ΔB·V and ΔB·ΔBᵀ from ΔB as held (ΔBᵀ in column form, read in place).
  template <typename DB, typename V, typename DBV, typename DBDBt>
  void delta_products(const DB& dB, const V& v, DBV& dBV, DBDBt& dBdBt) const {
    if (col) kernel::matmul_into(dB.transpose(), v, dBV), kernel::gram_into(dB, dBdBt);
    else kernel::matmul_into(dB, v, dBV), kernel::gram_into(dB.transpose(), dBdBt);
  }
};

/// Stage 1: U_S, U_R, Q_R gathered, and Q_S⁻¹ — Q_Sᵀ factored on the CPU's vectors
/// (kernel/small_lu.hpp: panel-blocked partial pivoting and Hager's rcond estimate), its storage
/// kept per thread; C = Q_R·Q_S⁻¹ later reads (Q_Sᵀ)⁻¹ transposed, in place.
template <typename Scalar>
void invert_basis_block(FitStage<Scalar>& f, const std::vector<Index>& S) {
  const std::vector<Index> R = complement(S, f.p.m());
  gather_rows(f.p.U, S, f.buf.US);
  gather_rows(f.p.U, R, f.buf.UR), gather_rows(f.p.Q, R, f.buf.QR);  // (m−r)×r, reused across products
  thread_local bd::kernel::SmallLU<double> lu;
  if (is_window(S)) lu.compute(f.p.Q.middleRows(S.front(), f.r()).transpose());
  else lu.compute(f.p.Q(S, Eigen::all).transpose());
  f.out.rcond = lu.rcond();
  require_nonsingular(f.out.rcond, S, f.p.name);
  lu.inverse_into(f.buf.QSinv_t);
}

/// Stage 2 for half and bfloat16: B formed in float, in blocks of basis_block entries along n
/// (columns of B, rows of Bᵀ), each rounded to B̂ and differenced to ΔB while it and V's rows
/// are in L2; ΔB·V and ΔB·ΔBᵀ are summed block by block (float Grams: fp32_basis implies
/// fp32_grams). Nothing r×n is held.
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
    f.form_B(buf.USf, Vb, Bb);
    f.times.fit += f.clock.lap();
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
    f.times.round += f.clock.lap();
    f.delta_products(buf.dBf, Vb, buf.dBVf_part, buf.dBdBtf_part);
    buf.dBVf += buf.dBVf_part, buf.dBdBtf += buf.dBdBtf_part;
  }
  f.formed_in_float = true;
}

/// Stage 2 otherwise: B in double, rounded once; ΔB kept in the type its Grams will be formed in.
template <typename Scalar>
void form_basis_in_double(FitStage<Scalar>& f) {
  FitBuffers& buf = f.buf;
  f.form_B(buf.US, f.p.V, buf.Bd);
  const Eigen::MatrixXd& B = buf.Bd;
  f.times.fit += f.clock.lap();
  f.out.B = round_matrix<Scalar>(B);
  if constexpr (std::is_same_v<Scalar, float>) {
    // One pass, no double temporary: float storage's ΔB is only read by the fp32 Grams.
    if (f.precision.fp32_grams) buf.dBf = (f.out.B.template cast<double>() - B).template cast<float>();
    else buf.dB = f.out.B.template cast<double>() - B;
  } else if constexpr (!FitStage<Scalar>::exact_basis) {
    buf.dB = values_as<double>(f.out.B) - B;
    if (f.precision.fp32_grams) buf.dBf = buf.dB.cast<float>();
  }
}

/// Stage 3: ΔB·V, ΔB·ΔBᵀ and ‖ΔB‖² in double, from whichever ΔB stage 2 left (zero for a
/// double basis, which is exact).
template <typename Scalar>
void delta_grams(FitStage<Scalar>& f) {
  FitBuffers& buf = f.buf;
  const Index r = f.r();
  buf.dBV.resize(r, r), buf.dBdBt.resize(r, r);
  if (FitStage<Scalar>::exact_basis) {
    buf.dBV.setZero(), buf.dBdBt.setZero();
  } else if (f.formed_in_float) {
    buf.dBV = buf.dBVf.cast<double>(), buf.dBdBt = buf.dBdBtf.cast<double>();
  } else if (f.precision.fp32_grams) {
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
  using kernel::matmul_into;
  FitBuffers& buf = f.buf;
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
  thread_local Eigen::LLT<MatrixXd> llt;
  llt.compute(BBt);
  if (!(llt.info() == Eigen::Success && llt.rcond() > 1e-13)) return matmul_into(buf.QR, QSinv, C);
  MatrixXd &inv = buf.inv, &M = buf.M, &T = buf.T;
  bd::kernel::inverse_into(llt, inv);
  M.resize(r, r), T.resize(r, r);
  matmul_into(Y, inv, M);  // M = I − Y·(B̂B̂ᵀ)⁻¹
  M = -M;
  M.diagonal().array() += 1.0;
  matmul_into(QSinv, M, T);
  matmul_into(buf.QR, T, C);
  if (f.out.rcond < well_conditioned_rcond) {
    const MatrixXd D = buf.UR - bd::kernel::matmul(bd::kernel::matmul(buf.QR, QSinv), buf.US);
    C += bd::kernel::matmul(D, bd::kernel::matmul(MatrixXd(GUSt + buf.dBV.transpose()), inv));
  }
  f.out.refitted = true;
}

/// Stage 6: ‖W − Ŵ‖² from Ĉ in row form ((m−r)×r; the column form's stored Ĉᵀ read transposed):
/// with D̂ = U_R − Ĉ·U_S in double (it cancels to the size of the error), the header's
/// ⟨D̂ᵀD̂, G⟩ − 2⟨ĈᵀD̂, ΔB·V⟩ + ⟨ĈᵀĈ, ΔB·ΔBᵀ⟩ + ‖ΔB‖². Its Grams are in float when allowed: they
/// are already at the scale of the error, so float keeps 6 digits of it.
template <typename Scalar, typename ChRow>
double exact_error(FitStage<Scalar>& f, const ChRow& Chr) {
  using Eigen::MatrixXd;
  using kernel::gram_into;
  FitBuffers& buf = f.buf;
  const Index r = f.r();
  const MatrixXd &G = f.p.G, &dBV = buf.dBV, &dBdBt = buf.dBdBt;
  MatrixXd& Dh = buf.Dh;
  Dh.resize(Chr.rows(), r);
  kernel::matmul_into(Chr, buf.US, Dh);
  Dh = buf.UR - Dh;  // elementwise: reading and writing the same entry
  if (FitStage<Scalar>::exact_basis) {
    MatrixXd& DtD = buf.T;
    DtD.resize(r, r);
    gram_into(Dh, DtD);
    return DtD.cwiseProduct(G).sum();
  }
  if (f.precision.fp32_grams) {
    Eigen::MatrixXf &X = buf.X, &XtX = buf.XtX;
    X.resize(Dh.rows(), 2 * r);
    X << Dh.cast<float>(), Chr.template cast<float>();
    XtX.resize(2 * r, 2 * r);
    gram_into(X, XtX);  // [D̂ Ĉ]ᵀ[D̂ Ĉ]: D̂ᵀD̂, ĈᵀD̂ and ĈᵀĈ as its blocks
    return XtX.topLeftCorner(r, r).cast<double>().cwiseProduct(G).sum() -
           2 * XtX.bottomLeftCorner(r, r).cast<double>().cwiseProduct(dBV).sum() +
           XtX.bottomRightCorner(r, r).cast<double>().cwiseProduct(dBdBt).sum() + f.dB2;
  }
  MatrixXd &DtD = buf.T, &CtD = buf.M, &CtC = buf.inv;
  DtD.resize(r, r), CtD.resize(r, r), CtC.resize(r, r);
  gram_into(Dh, DtD), kernel::matmul_into(Chr.transpose(), Dh, CtD), gram_into(Chr, CtC);
  return DtD.cwiseProduct(G).sum() - 2 * CtD.cwiseProduct(dBV).sum() + CtC.cwiseProduct(dBdBt).sum() + f.dB2;
}

/// B and C for the basis rows S of p, rounded once to Scalar, with the exact error: the stages
/// above in order, each timed into `times` (thread-seconds of fit, round and error).
template <typename Scalar>
BasisFit<Scalar> fit_basis(const FactoredProduct& p, std::vector<Index> S, bool refit, ProductPrecision precision,
                           Side side, PhaseTimes& times) {
  FitStage<Scalar> f{p, side == Side::Col, precision, fit_buffers(), times, {}, {}};
  invert_basis_block(f, S);
  if constexpr (bd::kernel::detail::is_narrow_v<Scalar>) {
    if (precision.fp32_basis) form_basis_in_float_blocks(f);
    else form_basis_in_double(f);
  } else {
    form_basis_in_double(f);
  }
  require_representable<Scalar>(f.out.B, "basis", p.name);
  f.times.round += f.clock.lap();
  delta_grams(f);
  fit_coefficients(f, refit);
  f.times.fit += f.clock.lap();
  // Stage 5: Ĉ = round(C), in the stored orientation.
  if (f.col) f.buf.Ct = f.buf.C.transpose();
  f.out.C = round_matrix<Scalar>(f.col ? f.buf.Ct : f.buf.C);
  require_representable<Scalar>(f.out.C, "coefficient matrix", p.name);
  f.times.round += f.clock.lap();
  Eigen::MatrixXd& Ch = f.buf.Ch;
  Ch.resize(f.out.C.rows(), f.out.C.cols());
  kernel::widen_into(f.out.C.data(), f.out.C.size(), Ch.data());
  f.out.residual2 = std::max(0.0, f.col ? exact_error(f, Ch.transpose()) : exact_error(f, Ch));
  f.out.S = std::move(S);
  f.times.error += f.clock.lap();
  return std::move(f.out);
}

/// The same for a dense W (W in row form; B and C stored as `side` holds them): B = W_S exactly,
/// C by least squares against round(B) (or B when refit is off), residual computed on W itself.
template <typename Scalar>
BasisFit<Scalar> fit_basis_dense(const Eigen::MatrixXd& W, const FactoredProduct& p, std::vector<Index> S, bool refit,
                                 Side side, PhaseTimes& times) {
  using Eigen::MatrixXd;
  Stopwatch clock;
  BasisFit<Scalar> fit;
  const std::vector<Index> R = complement(S, W.rows());
  Eigen::PartialPivLU<MatrixXd> lu(MatrixXd(p.Q(S, Eigen::all)));
  fit.rcond = lu.rcond();
  require_nonsingular(fit.rcond, S, p.name);

  const MatrixXd B = W(S, Eigen::all);
  times.fit += clock.lap();
  fit.B = round_matrix<Scalar>(B);
  require_representable<Scalar>(fit.B, "basis", p.name);
  const MatrixXd Bh = values_as<double>(fit.B);
  times.round += clock.lap();
  const MatrixXd WR = W(R, Eigen::all);
  Eigen::ColPivHouseholderQR<MatrixXd> qr(MatrixXd(refit ? Bh : B).transpose());
  const MatrixXd C = qr.solve(WR.transpose()).transpose();
  times.fit += clock.lap();
  fit.C = round_matrix<Scalar>(C);
  fit.refitted = refit;
  require_representable<Scalar>(fit.C, "coefficient matrix", p.name);
  times.round += clock.lap();
  fit.residual2 = (WR - values_as<double>(fit.C) * Bh).squaredNorm() + (B - Bh).squaredNorm();
  if (side == Side::Col) fit.B.transposeInPlace(), fit.C.transposeInPlace();
  fit.S = std::move(S);
  times.error += clock.lap();
  return fit;
}

}  // namespace bd::detail

namespace bd {

/// Entries of B along n formed, rounded and differenced together when B is formed in float
/// (half and bfloat16 storage): results do not depend on it, timings do.
inline constexpr Index basis_block = detail::basis_block;

}  // namespace bd
