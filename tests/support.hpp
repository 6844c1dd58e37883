// Helpers shared by bd's tests: seeded random factors, error measures, the shared folder.
#pragma once

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>

#include <Eigen/Core>
#include <Eigen/LU>
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
inline Eigen::MatrixXd gaussian(Eigen::Index rows, Eigen::Index cols, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  return Eigen::MatrixXd::NullaryExpr(rows, cols, [&]() { return normal(rng); });
}

struct Product {
  Eigen::MatrixXd U, V;
  Eigen::MatrixXd W() const { return U * V.transpose(); }
};

inline Product random_product(Eigen::Index m, Eigen::Index n, Eigen::Index r, unsigned seed) {
  return {gaussian(m, r, seed), gaussian(n, r, seed + 7919)};
}

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
inline double norm1(const Eigen::MatrixXd& A) { return A.cwiseAbs().colwise().sum().maxCoeff(); }

/// Holds a computed inverse X of A (computed in arithmetic of unit u) to a yardstick that shares
/// nothing with it: A⁻¹ from Eigen's FullPivLU in double, and κ₁(A) = ‖A‖₁·‖A⁻¹‖₁ from that —
/// never from X, whose own error would scale its bound (an inverse off by 2× would pass).
/// Bound: 4·√n·u·κ₁ on the forward error ‖X − A⁻¹‖₁/‖A⁻¹‖₁ and on the residual ‖A·X − I‖₁. The
/// worst case is c·n·u·κ (Higham, Accuracy and Stability, §14.3); rounding errors of random sign
/// grow like √n (§2.8), which is what the random matrices here show (at most 0.3 of this bound),
/// and the worst case would reach 0.5 at n = 131 in float, passing an inverse 50 % off. The bound
/// is required below 0.05, so any inverse 5 % or more off fails.
inline void check_inverse(const Eigen::MatrixXd& A, const Eigen::MatrixXd& X, double u) {
  const Eigen::Index n = A.rows();
  REQUIRE(X.rows() == n);
  REQUIRE(X.cols() == n);
  const Eigen::MatrixXd reference = A.fullPivLu().inverse();
  const double kappa = norm1(A) * norm1(reference);
  const double bound = 4.0 * std::sqrt(double(n)) * u * kappa;
  INFO("n = " << n << ", κ₁ = " << kappa << ", bound " << bound);
  REQUIRE(bound < 0.05);
  CHECK(norm1(X - reference) <= bound * norm1(reference));
  CHECK(norm1(A * X - Eigen::MatrixXd::Identity(n, n)) <= bound);
}

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

/// The folder of the real models that ship with bd (examples/models), or BD_MODELS_DIR from the
/// environment.
inline std::string models_dir() {
  if (const char* env = std::getenv("BD_MODELS_DIR")) return env;
  return BD_MODELS_DIR;
}

/// The folder of a shipped model. It is part of the repository: a missing one is a broken
/// checkout, so the test fails and says so (it is not skipped).
inline std::string require_model(const std::string& name) {
  const std::string dir = models_dir() + "/" + name;
  if (!std::filesystem::exists(dir + "/model.safetensors")) {
    std::cerr << "FAILED: " << dir << "/model.safetensors not found; it ships with bd (examples/models): "
              << "is the checkout complete?\n";
    std::exit(1);
  }
  return dir;
}

}  // namespace bd_test
