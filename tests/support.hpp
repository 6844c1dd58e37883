// Helpers shared by bd's tests: seeded random factors, error measures, references apart from
// bd, the shared folder. What is not a template is defined once, in support.cpp: a non-template
// inline function here instantiated everything it calls (Eigen's FullPivLU, HouseholderQR,
// ColPivHouseholderQR, <random>'s normal distribution) in every test file that included this
// header, called or not.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include <Eigen/Core>
#include <catch2/catch.hpp>

#include <bd/bd.hpp>
#include <bd/kernel/cpu.hpp>

/// Checks that expr throws Type and that what() satisfies a string matcher.
#define BD_CHECK_THROWS_CONTAINING(expr, Type, matcher) \
  do {                                                 \
    CHECK_THROWS_AS(expr, Type);                       \
    CHECK_THROWS_WITH(expr, matcher);                  \
  } while (0)


namespace bd_test {

/// A seeded standard Gaussian matrix (weights of a freshly initialised layer).
Eigen::MatrixXd gaussian(Eigen::Index rows, Eigen::Index cols, unsigned seed);

struct Product {
  Eigen::MatrixXd U, V;
  Eigen::MatrixXd W() const;  ///< U·Vᵀ
};

Product random_product(Eigen::Index m, Eigen::Index n, Eigen::Index r, unsigned seed);

/// ‖A − B‖²_F / ‖B‖²_F in double.
template <typename DA, typename DB>
double nmse(const Eigen::MatrixBase<DA>& approx, const Eigen::MatrixBase<DB>& exact) {
  return (approx.template cast<double>() - exact.template cast<double>()).squaredNorm() /
         exact.template cast<double>().squaredNorm();
}

/// Rebuilds W from basis(), coeff() and indices() by the identities alone — independent of
/// Decomposition::reconstruct(): row form W[S] = B, W[R] = C·B; column form W[:,S] = B, W[:,R] = B·C.
template <typename Scalar>
Eigen::MatrixXd rebuild(const bd::Decomposition<Scalar>& d) {
  const Eigen::MatrixXd B = d.basis().template cast<double>();
  const Eigen::MatrixXd C = d.coeff().template cast<double>();
  Eigen::MatrixXd W(d.rows(), d.cols());
  const auto& S = d.indices();
  const auto R = d.rest();
  if (d.side() == bd::Side::Row) {
    const Eigen::MatrixXd CB = C * B;
    for (std::size_t k = 0; k < S.size(); ++k) W.row(S[k]) = B.row(static_cast<Eigen::Index>(k));
    for (std::size_t k = 0; k < R.size(); ++k) W.row(R[k]) = CB.row(static_cast<Eigen::Index>(k));
  } else {
    const Eigen::MatrixXd BC = B * C;
    for (std::size_t k = 0; k < S.size(); ++k) W.col(S[k]) = B.col(static_cast<Eigen::Index>(k));
    for (std::size_t k = 0; k < R.size(); ++k) W.col(R[k]) = BC.col(static_cast<Eigen::Index>(k));
  }
  return W;
}

/// ‖A‖₁, the largest column sum of |A|.
double norm1(const Eigen::MatrixXd& A);

/// Holds a computed inverse X of A (computed in arithmetic of unit u) to a yardstick that shares
/// nothing with it: A⁻¹ from Eigen's FullPivLU in double, and κ₁(A) = ‖A‖₁·‖A⁻¹‖₁ from that —
/// never from X, whose own error would scale its bound (an inverse off by 2× would pass).
/// Bound: 4·√n·u·κ₁ on the forward error ‖X − A⁻¹‖₁/‖A⁻¹‖₁ and on the residual ‖A·X − I‖₁. The
/// worst case is c·n·u·κ (Higham, Accuracy and Stability, §14.3); rounding errors of random sign
/// grow like √n (§2.8), which is what the random matrices here show (at most 0.3 of this bound),
/// and the worst case would reach 0.5 at n = 131 in float, passing an inverse 50 % off. The bound
/// is required below 0.05, so any inverse 5 % or more off fails.
void check_inverse(const Eigen::MatrixXd& A, const Eigen::MatrixXd& X, double u);

/// References apart from bd: Eigen's decompositions, in double unless said.
namespace reference {
/// A⁻¹ (FullPivLU).
Eigen::MatrixXd inverse(const Eigen::MatrixXd& A);
/// A⁻¹·B (FullPivLU).
Eigen::MatrixXd solve(const Eigen::MatrixXd& A, const Eigen::MatrixXd& B);
/// The first G.cols() columns of the Q of G's Householder QR: orthonormal, spanning G (G has at
/// least as many rows as columns).
Eigen::MatrixXd orthonormal_columns(const Eigen::MatrixXd& G);
/// QR with column pivoting's (Businger–Golub, ColPivHouseholderQR) column order, and its rank.
std::vector<Eigen::Index> column_pivots(const Eigen::MatrixXd& A);
Eigen::Index rank(const Eigen::MatrixXd& A);
/// The reciprocal 1-norm condition estimates of Eigen's LLT and PartialPivLU of A, factored in
/// A's own type.
double llt_rcond(const Eigen::MatrixXd& A);
double llt_rcond(const Eigen::MatrixXf& A);
double lu_rcond(const Eigen::MatrixXd& A);
double lu_rcond(const Eigen::MatrixXf& A);
}  // namespace reference

/// First-order bound on the NMSE of a decomposition stored in a type of unit roundoff u:
/// each stored entry carries a relative error ≤ u, so |Ŵ_R − W_R| ≤ 2u·|C|·|B| entrywise and
/// |Ŵ_S − W_S| ≤ u·|B|, hence ‖E‖² ≤ u²·(4‖|C||B|‖² + ‖B‖²). The factor 1.01 covers the
/// second-order terms (u² relative).
template <typename Scalar>
double rounding_bound(const bd::Decomposition<Scalar>& d, double u) {
  const Eigen::MatrixXd B = d.basis().template cast<double>().cwiseAbs();
  const Eigen::MatrixXd C = d.coeff().template cast<double>().cwiseAbs();
  const Eigen::MatrixXd CB = d.side() == bd::Side::Row ? Eigen::MatrixXd(C * B) : Eigen::MatrixXd(B * C);
  return 1.01 * u * u * (4 * CB.squaredNorm() + B.squaredNorm()) / (d.report().norm * d.report().norm);
}

/// Runs body() once on every kernel instruction set (bd::kernel::Isa), forced with use_isa();
/// a set this CPU lacks is reported as skipped, by name. The choice in force before is restored.
template <typename Body>
void for_each_isa(Body&& body) {
  using bd::kernel::Isa;
  struct Restore {
    Isa before = bd::kernel::active_isa();
    ~Restore() { bd::kernel::use_isa(before); }
  } restore;
  for (Isa isa : {Isa::Portable, Isa::AVX2, Isa::AVX512}) {
    if (!bd::kernel::cpu_has(isa)) {
      WARN("skipped: CPU lacks " << (isa == Isa::AVX512 ? "AVX-512 (F, BW, DQ, VL)" : "AVX2 + FMA"));
      continue;
    }
    bd::kernel::use_isa(isa);
    INFO("kernels: " << bd::kernel::to_string(isa));
    body();
  }
}

/// Runs body() on every instruction set and, on AVX-512 with AVX512-BF16, once with vdpbf16ps and
/// once with FMAs on the rounded operands (the tuning's bf16 choice).
template <typename Body>
void for_each_bf16_path(Body&& body) {
  using bd::kernel::Bf16Method;
  using bd::kernel::Isa;
  for_each_isa([&] {
    const Isa isa = bd::kernel::active_isa();
    const bd::kernel::Tuning before = bd::kernel::active_context().tuning;
    for (Bf16Method method : {Bf16Method::Dot, Bf16Method::Fma}) {
      bd::kernel::Tuning t = before;
      t.bf16 = method;
      bd::kernel::use_tuning(isa, t);
      if (method == Bf16Method::Dot && bd::kernel::active_context().bf16_method() != Bf16Method::Dot) {
        if (isa == Isa::AVX512) WARN("vdpbf16ps skipped: this CPU lacks AVX512-BF16");
        continue;
      }
      INFO("bf16 by " << bd::kernel::to_string(method));
      body();
    }
    bd::kernel::use_tuning(isa, before);
  });
}

/// The folder of the real models that ship with bd (examples/models), or BD_MODELS_DIR from the
/// environment.
std::string models_dir();

/// The folder of a shipped model. It is part of the repository: a missing one is a broken
/// checkout, so the test fails and says so (it is not skipped).
std::string require_model(const std::string& name);

}  // namespace bd_test
