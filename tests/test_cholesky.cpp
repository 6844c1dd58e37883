// bd::kernel's Cholesky factors and its Householder range — what preparation factors its Grams
// and its ill-conditioned factors with — are backward stable as the textbook algorithms are:
// L·Lᵀ = A to c·n·u·‖A‖ across the 32-column panels the factorization is blocked by, the same
// condition estimate as Eigen's LLT, a pivoted factor of a semidefinite A of A's rank, and an
// orthonormal Q spanning A where the Cholesky QR gives up (κ up to 10¹²), with Eigen's rank.
#include <bd/kernel/cholesky.hpp>
#include <bd/kernel/householder_qr.hpp>

#include <cmath>
#include <limits>

#include "support.hpp"

namespace {

template <typename T>
using Dense = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;

/// A symmetric positive definite n×n matrix with condition number about κ: Q·diag·Qᵀ, the
/// eigenvalues spread geometrically from 1 to 1/κ.
Eigen::MatrixXd spd(Eigen::Index n, double kappa, unsigned seed) {
  const Eigen::MatrixXd Q = bd_test::reference::orthonormal_columns(bd_test::gaussian(n, n, seed));
  Eigen::VectorXd d(n);
  for (Eigen::Index i = 0; i < n; ++i) d(i) = std::pow(kappa, -double(i) / double(std::max<Eigen::Index>(1, n - 1)));
  Eigen::MatrixXd A = Q * d.asDiagonal() * Q.transpose();
  return (A + A.transpose()) / 2;
}

template <typename T>
void check_cholesky(const Eigen::MatrixXd& Ad) {
  const Eigen::Index n = Ad.rows();
  const double u = Eigen::NumTraits<T>::epsilon();
  const Dense<T> A = Ad.cast<T>();
  bd::kernel::Cholesky<T> llt(A);
  REQUIRE(llt.ok());
  const Eigen::MatrixXd L = llt.matrixL().template cast<double>();
  CHECK(L.isLowerTriangular(0.0));
  CHECK((L.diagonal().array() > 0).all());
  // Backward error: |A − L·Lᵀ| ≤ γ_{n+1}·|L|·|Lᵀ| (Higham, Thm 10.3).
  const double bound = 2.0 * double(n + 1) * u * (L.cwiseAbs() * L.cwiseAbs().transpose()).maxCoeff();
  CHECK((A.template cast<double>() - L * L.transpose()).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() <= bound);
  // The same estimator as Eigen's LLT::rcond (rounding may steer it to another bound).
  const double ref_rcond = bd_test::reference::llt_rcond(A);
  CHECK(llt.rcond() >= 0.5 * ref_rcond);
  CHECK(llt.rcond() <= 2.0 * ref_rcond);
  CHECK(std::abs(llt.norm1() - bd_test::norm1(A.template cast<double>())) <= double(n) * u * llt.norm1());
  // A solve and the inverse, against double apart from the kernel.
  const Eigen::MatrixXd exact_inverse = bd_test::reference::inverse(A.template cast<double>());
  const double kappa = bd_test::norm1(A.template cast<double>()) * bd_test::norm1(exact_inverse);
  const Eigen::Matrix<T, Eigen::Dynamic, 1> b = bd_test::gaussian(n, 1, unsigned(n) + 3).col(0).cast<T>();
  const Eigen::VectorXd want = exact_inverse * b.template cast<double>();
  CHECK((llt.solve(b).template cast<double>() - want).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() <=
        4.0 * std::sqrt(double(n)) * u * kappa * want.cwiseAbs().maxCoeff());
  Dense<T> inv;
  llt.inverse_into(inv);
  CHECK(inv == inv.transpose());
  bd_test::check_inverse(A.template cast<double>(), inv.template cast<double>(), u);
}

}  // namespace

TEST_CASE("Cholesky: L·Lᵀ = A to the textbook bound, across its 32-column panels, on every kernel",
          "[kernel][cholesky]") {
  bd_test::for_each_isa([] {
    for (Eigen::Index n : {1, 2, 7, 31, 32, 33, 64, 100, 128, 161}) {
      INFO("n = " << n);
      check_cholesky<double>(spd(n, 1e6, unsigned(n)));
      check_cholesky<float>(spd(n, 1e2, unsigned(n) + 1));
    }
  });
}

TEST_CASE("Cholesky: an indefinite, singular or NaN matrix is not factored", "[kernel][cholesky]") {
  for (Eigen::Index n : {3, 40}) {
    INFO("n = " << n);
    Eigen::MatrixXd A = spd(n, 10, 5);
    A(n - 1, n - 1) = -1.0;  // the last pivot negative: a trailing panel refuses it
    CHECK_FALSE(bd::kernel::Cholesky<double>(A).ok());
    CHECK(bd::kernel::Cholesky<double>(A).rcond() == 0.0);
    const Eigen::MatrixXd G = bd_test::gaussian(n, n - 1, 7);
    CHECK_FALSE(bd::kernel::Cholesky<double>(Eigen::MatrixXd(G * G.transpose() - 1e-9 * Eigen::MatrixXd::Identity(n, n))).ok());
    Eigen::MatrixXd B = spd(n, 10, 6);
    B(n / 2, n / 2) = std::numeric_limits<double>::quiet_NaN();
    CHECK_FALSE(bd::kernel::Cholesky<double>(B).ok());
  }
  CHECK_THROWS_AS(bd::kernel::Cholesky<double>(Eigen::MatrixXd::Identity(3, 2)), bd::ShapeError);
}

TEST_CASE("semidefinite factor: F·Fᵀ = A with as many columns as A's rank", "[kernel][cholesky]") {
  for (Eigen::Index n : {1, 8, 33, 128}) {
    for (Eigen::Index k : {Eigen::Index(0), n / 2, n - 1, n}) {
      INFO("n = " << n << ", rank " << k);
      const Eigen::MatrixXd G = bd_test::gaussian(n, k, unsigned(n + k));
      const Eigen::MatrixXd A = G * G.transpose();
      const Eigen::MatrixXd F = bd::kernel::semidefinite_factor(A);
      CHECK(F.rows() == n);
      CHECK(F.cols() == k);
      const double scale = std::max(1.0, A.cwiseAbs().maxCoeff());
      CHECK((F * F.transpose() - A).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() <= 20.0 * double(n) * 1.1e-16 * scale);
    }
  }
}

TEST_CASE("Householder range: orthonormal Q spanning A where κ(A) defeats the Cholesky QR, Eigen's rank",
          "[kernel][householder]") {
  const double u = Eigen::NumTraits<double>::epsilon();
  for (Eigen::Index m : {40, 300}) {
    for (Eigen::Index n : {1, 8, 33}) {
      for (double kappa : {1.0, 1e8, 1e12}) {
        INFO("m = " << m << ", n = " << n << ", κ ≈ " << kappa);
        // A = X·diag·Y with X orthonormal, singular values from 1 down to 1/κ.
        const Eigen::MatrixXd X = bd_test::reference::orthonormal_columns(bd_test::gaussian(m, n, unsigned(m + n)));
        Eigen::VectorXd s(n);
        for (Eigen::Index i = 0; i < n; ++i) s(i) = std::pow(kappa, -double(i) / double(std::max<Eigen::Index>(1, n - 1)));
        const Eigen::MatrixXd A = X * s.asDiagonal() * spd(n, 10, unsigned(n));
        Eigen::MatrixXd Q;
        CHECK(bd::kernel::householder_range(A, Q) == n);
        REQUIRE(Q.rows() == m);
        REQUIRE(Q.cols() == n);
        CHECK((Q.transpose() * Q - Eigen::MatrixXd::Identity(n, n)).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() <= 10.0 * double(m) * u);
        // range(Q) = range(A): A is its own projection onto range(Q), column by column.
        CHECK((A - Q * (Q.transpose() * A)).norm() <= 10.0 * double(m) * u * A.norm());
      }
    }
  }
  // A rank-deficient A: the rank Eigen's ColPivHouseholderQR reports.
  for (Eigen::Index deficiency : {1, 3}) {
    const Eigen::Index m = 60, n = 20;
    const Eigen::MatrixXd A = bd_test::gaussian(m, n - deficiency, 3) * bd_test::gaussian(n - deficiency, n, 4);
    Eigen::MatrixXd Q;
    const Eigen::Index rank = bd::kernel::householder_range(A, Q);
    CHECK(rank == n - deficiency);
    CHECK(rank == bd_test::reference::rank(A));
  }
  Eigen::MatrixXd Q;
  CHECK(bd::kernel::householder_range(Eigen::MatrixXd(Eigen::MatrixXd::Zero(5, 2)), Q) == 0);
  CHECK_THROWS_AS(bd::kernel::householder_range(Eigen::MatrixXd(Eigen::MatrixXd::Zero(2, 5)), Q), bd::ShapeError);
}
