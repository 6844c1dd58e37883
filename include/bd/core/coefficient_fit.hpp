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

/// `times` receives the thread-seconds of the fit, round and error steps. `side` is the
/// Decomposition's: the column form's B is formed transposed, Bᵀ = V·U_Sᵀ (n×r), so the stored
/// result is written once in its own orientation and ΔB·ΔBᵀ is the Gram of ΔBᵀ's columns.
template <typename Scalar>
BasisFit<Scalar> fit_basis(const FactoredProduct& p, std::vector<Index> S, bool refit, ProductPrecision precision,
                           Side side, PhaseTimes& times) {
  using Eigen::MatrixXd;
  using Eigen::MatrixXf;
  using bd::kernel::gram_into;
  using bd::kernel::matmul_into;
  // Products of r×r and larger run on the dispatched kernel (kernel/matmul.hpp), not at the
  // SSE2 speed Eigen has in a build without -march; solves go through explicit r×r inverses
  // so that their many right-hand sides become products too. Every intermediate lives in the
  // thread's FitBuffers.
  const Index r = p.r();
  Stopwatch clock;
  BasisFit<Scalar> fit;
  const std::vector<Index> R = complement(S, p.m());
  FitBuffers& buf = fit_buffers();
  gather_rows(p.U, S, buf.US);
  gather_rows(p.U, R, buf.UR), gather_rows(p.Q, R, buf.QR);  // (m−r)×r, reused across products
  const MatrixXd &US = buf.US, &UR = buf.UR, &QR = buf.QR;
  const auto USt = US.transpose();

  // Q_Sᵀ factored on the CPU's vectors (kernel/small_lu.hpp: panel-blocked partial pivoting and
  // Hager's rcond estimate); the factorization's storage is kept per thread. C = Q_R·Q_S⁻¹ reads
  // (Q_Sᵀ)⁻¹ transposed, in place.
  thread_local bd::kernel::SmallLU<double> lu;
  if (is_window(S)) lu.compute(p.Q.middleRows(S.front(), r).transpose());
  else lu.compute(p.Q(S, Eigen::all).transpose());
  fit.rcond = lu.rcond();
  require_nonsingular(fit.rcond, S, p.name);
  lu.inverse_into(buf.QSinv_t);
  const auto QSinv = buf.QSinv_t.transpose();

  // B = U_S·Vᵀ (or Bᵀ), its stored value B̂ and ΔB = B̂ − B (float when the Grams are).
  const bool col = side == Side::Col;
  const Index n = p.n();
  // B (or Bᵀ) for V's rows given: all of them, or one block of them.
  auto form_B = [&](const auto& USo, const auto& Vo, auto& out) {
    if (col) out.resize(Vo.rows(), r), matmul_into(Vo, USo.transpose(), out);
    else out.resize(r, Vo.rows()), matmul_into(USo, Vo.transpose(), out);
  };
  // ΔB·V and ΔB·ΔBᵀ from ΔB as held (ΔBᵀ in column form, read in place).
  auto delta_products = [&](const auto& dBo, const auto& Vo, auto& dBVo, auto& dBdBto) {
    if (col) matmul_into(dBo.transpose(), Vo, dBVo), gram_into(dBo, dBdBto);
    else matmul_into(dBo, Vo, dBVo), gram_into(dBo.transpose(), dBdBto);
  };
  const bool exact_basis = std::is_same_v<Scalar, double>;
  MatrixXf& dBf = buf.dBf;
  MatrixXd& dB = buf.dB;
  double dB2 = 0;  // ‖ΔB‖²
  bool formed_in_float = false;
  if constexpr (bd::kernel::detail::is_narrow_v<Scalar>) {
    if (precision.fp32_basis) {
      // In blocks of basis_block entries along n (columns of B, rows of Bᵀ): a block's B, B̂ and
      // ΔB and V's rows stay in L2 from forming B to ΔB·V and ΔB·ΔBᵀ, which sum block by block
      // (the Grams are float here: fp32_basis implies fp32_grams). Nothing r×n is held.
      buf.USf = US.cast<float>();
      fit.B.resize(col ? n : r, col ? r : n);
      buf.dBVf.setZero(r, r), buf.dBdBtf.setZero(r, r);
      buf.dBVf_part.resize(r, r), buf.dBdBtf_part.resize(r, r);
      for (Index j0 = 0; j0 < n; j0 += basis_block) {
        const Index w = std::min(basis_block, n - j0);
        const auto Vb = p.Vf().middleRows(j0, w);
        MatrixXf& Bb = buf.Bf;
        form_B(buf.USf, Vb, Bb);
        times.fit += clock.lap();
        // B̂ and B are floats within a factor 2 of each other: their difference is exact (Sterbenz).
        dBf.resize(Bb.rows(), Bb.cols());
        const Index runs = col ? r : 1, run = col ? w : r * w;  // contiguous runs of the stored block
        for (Index c = 0; c < runs; ++c) {
          Scalar* stored = col ? &fit.B(j0, c) : &fit.B(0, j0);
          kernel::round_into(Bb.data() + c * run, run, stored);
          kernel::widen_into(stored, run, dBf.data() + c * run);
        }
        dBf -= Bb;
        dB2 += squared_norm_in_double(dBf);
        times.round += clock.lap();
        delta_products(dBf, Vb, buf.dBVf_part, buf.dBdBtf_part);
        buf.dBVf += buf.dBVf_part, buf.dBdBtf += buf.dBdBtf_part;
      }
      formed_in_float = true;
    }
  }
  if (!formed_in_float) {
    form_B(US, p.V, buf.Bd);
    const MatrixXd& B = buf.Bd;
    times.fit += clock.lap();
    fit.B = round_matrix<Scalar>(B);
    if constexpr (std::is_same_v<Scalar, float>) {
      // One pass, no double temporary: float storage's ΔB is only read by the fp32 Grams.
      if (precision.fp32_grams) dBf = (fit.B.template cast<double>() - B).template cast<float>();
      else dB = fit.B.template cast<double>() - B;
    } else if constexpr (!std::is_same_v<Scalar, double>) {
      dB = values_as<double>(fit.B) - B;
      if (precision.fp32_grams) dBf = dB.cast<float>();
    }
  }
  require_representable<Scalar>(fit.B, "basis", p.name);
  times.round += clock.lap();

  MatrixXd& C = buf.C;
  C.resize(static_cast<Index>(R.size()), r);
  MatrixXd &dBV = buf.dBV, &dBdBt = buf.dBdBt;
  dBV.resize(r, r), dBdBt.resize(r, r);
  if (exact_basis) {
    // B̂ = B: ΔB = 0, and C is already the least-squares fit; nothing to refit against.
    dBV.setZero(), dBdBt.setZero();
    matmul_into(QR, QSinv, C);
  } else {
    if (formed_in_float) {
      dBV = buf.dBVf.cast<double>(), dBdBt = buf.dBdBtf.cast<double>();
    } else if (precision.fp32_grams) {
      buf.dBVf.resize(r, r), buf.dBdBtf.resize(r, r);
      delta_products(dBf, p.Vf(), buf.dBVf, buf.dBdBtf);
      dBV = buf.dBVf.cast<double>(), dBdBt = buf.dBdBtf.cast<double>();
      dB2 = squared_norm_in_double(dBf);
    } else {
      delta_products(dB, p.V, dBV, dBdBt);
      dB2 = dB.squaredNorm();
    }
    if (!refit) {
      matmul_into(QR, QSinv, C);
    } else {
      // Normal equations C'·B̂B̂ᵀ = U_R·Vᵀ·B̂ᵀ with B̂ = B + ΔB and C·U_S = U_R − D:
      //   Y = ΔB·B̂ᵀ = ΔB·V·U_Sᵀ + ΔB·ΔBᵀ,   B̂B̂ᵀ = U_S·G·U_Sᵀ + Y + Yᵀ − ΔB·ΔBᵀ,
      //   C' = C − C·Y·(B̂B̂ᵀ)⁻¹ + D·(G·U_Sᵀ + (ΔB·V)ᵀ)·(B̂B̂ᵀ)⁻¹.
      // Without D, C' = Q_R·Q_S⁻¹·(I − Y·(B̂B̂ᵀ)⁻¹): one (m−r)×r×r product for the whole fit.
      MatrixXd &GUSt = buf.GUSt, &Y = buf.Y, &BBt = buf.BBt;
      GUSt.resize(r, r), Y.resize(r, r), BBt.resize(r, r);
      matmul_into(p.G, USt, GUSt);
      matmul_into(dBV, USt, Y);
      Y += dBdBt;
      matmul_into(US, GUSt, BBt);
      BBt += Y + Y.transpose() - dBdBt;
      thread_local Eigen::LLT<MatrixXd> llt;
      llt.compute(BBt);
      // A dependent basis (rank-deficient V) leaves B̂B̂ᵀ singular: the unrefitted C is then kept.
      if (llt.info() == Eigen::Success && llt.rcond() > 1e-13) {
        MatrixXd &inv = buf.inv, &M = buf.M, &T = buf.T;
        bd::kernel::inverse_into(llt, inv);
        M.resize(r, r), T.resize(r, r);
        matmul_into(Y, inv, M);  // M = I − Y·(B̂B̂ᵀ)⁻¹
        M = -M;
        M.diagonal().array() += 1.0;
        matmul_into(QSinv, M, T);
        matmul_into(QR, T, C);
        if (fit.rcond < well_conditioned_rcond) {
          const MatrixXd D = UR - bd::kernel::matmul(bd::kernel::matmul(QR, QSinv), US);
          C += bd::kernel::matmul(D, bd::kernel::matmul(MatrixXd(GUSt + dBV.transpose()), inv));
        }
        fit.refitted = true;
      } else {
        matmul_into(QR, QSinv, C);
      }
    }
  }

  times.fit += clock.lap();
  if (col) {
    buf.Ct = C.transpose();
    fit.C = round_matrix<Scalar>(buf.Ct);
  } else {
    fit.C = round_matrix<Scalar>(C);
  }
  require_representable<Scalar>(fit.C, "coefficient matrix", p.name);
  times.round += clock.lap();
  // The exact error from Ĉ in row form ((m−r)×r; the column form's stored Ĉᵀ read transposed).
  MatrixXd& Ch = buf.Ch;
  Ch.resize(fit.C.rows(), fit.C.cols());
  kernel::widen_into(fit.C.data(), fit.C.size(), Ch.data());
  auto exact_error = [&](const auto& Chr) {
    // D̂ = U_R − Ĉ·U_S in double (it cancels to the size of the error); its Grams in float when
    // allowed: they are already at the scale of the error, so float keeps 6 digits of it.
    MatrixXd& Dh = buf.Dh;
    Dh.resize(Chr.rows(), r);
    matmul_into(Chr, US, Dh);
    Dh = UR - Dh;  // elementwise: reading and writing the same entry
    if (exact_basis) {
      MatrixXd& DtD = buf.T;
      DtD.resize(r, r);
      gram_into(Dh, DtD);
      return DtD.cwiseProduct(p.G).sum();
    }
    if (precision.fp32_grams) {
      MatrixXf &X = buf.X, &XtX = buf.XtX;
      X.resize(Dh.rows(), 2 * r);
      X << Dh.cast<float>(), Chr.template cast<float>();
      XtX.resize(2 * r, 2 * r);
      gram_into(X, XtX);  // [D̂ Ĉ]ᵀ[D̂ Ĉ]: D̂ᵀD̂, ĈᵀD̂ and ĈᵀĈ as its blocks
      return XtX.topLeftCorner(r, r).cast<double>().cwiseProduct(p.G).sum() -
             2 * XtX.bottomLeftCorner(r, r).cast<double>().cwiseProduct(dBV).sum() +
             XtX.bottomRightCorner(r, r).cast<double>().cwiseProduct(dBdBt).sum() + dB2;
    }
    MatrixXd &DtD = buf.T, &CtD = buf.M, &CtC = buf.inv;
    DtD.resize(r, r), CtD.resize(r, r), CtC.resize(r, r);
    gram_into(Dh, DtD), matmul_into(Chr.transpose(), Dh, CtD), gram_into(Chr, CtC);
    return DtD.cwiseProduct(p.G).sum() - 2 * CtD.cwiseProduct(dBV).sum() + CtC.cwiseProduct(dBdBt).sum() + dB2;
  };
  const double e2 = col ? exact_error(Ch.transpose()) : exact_error(Ch);
  fit.residual2 = std::max(0.0, e2);
  fit.S = std::move(S);
  times.error += clock.lap();
  return fit;
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
