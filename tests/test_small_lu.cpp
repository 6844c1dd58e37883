// bd::kernel::SmallLU — the r×r LU that ranks basis windows — is a backward-stable LU with
// partial pivoting on every micro-kernel this CPU runs: P·A = L·U to c·n·u·‖A‖ (Wilkinson, with
// the small growth of random matrices), multipliers bounded by one, solves and inverses as
// accurate as Eigen's, and the same condition estimate as Eigen's PartialPivLU.
#include <bd/kernel/small_lu.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "support.hpp"

namespace {

template <typename T>
using Dense = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;

template <typename T>
void check_factorization(const Dense<T>& A) {
  const Eigen::Index n = A.rows();
  const double u = Eigen::NumTraits<T>::epsilon();
  const bd::kernel::SmallLU<T> lu(A);
  std::vector<Eigen::Index> sorted = lu.permutation();
  std::sort(sorted.begin(), sorted.end());
  std::vector<Eigen::Index> identity(static_cast<std::size_t>(n));
  std::iota(identity.begin(), identity.end(), Eigen::Index(0));
  REQUIRE(sorted == identity);

  const Eigen::MatrixXd LU = lu.matrixLU().template cast<double>();
  const Eigen::MatrixXd L = Eigen::MatrixXd(LU.triangularView<Eigen::UnitLower>());
  const Eigen::MatrixXd U = Eigen::MatrixXd(LU.triangularView<Eigen::Upper>());
  Eigen::MatrixXd PA(n, n);
  for (Eigen::Index i = 0; i < n; ++i) PA.row(i) = A.row(lu.permutation()[static_cast<std::size_t>(i)]).template cast<double>();
  // Backward error of Gaussian elimination: |PA − LU| ≤ γ_n·|L|·|U| (Higham, Thm 9.3).
  const double bound = 2.0 * double(n) * u * (L.cwiseAbs() * U.cwiseAbs()).maxCoeff();
  CHECK((PA - L * U).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() <= bound);
  // Partial pivoting: every multiplier at most one (formed as a·(1/pivot): one more rounding).
  CHECK(L.cwiseAbs().maxCoeff() <= 1.0 + 4 * u);

  // Solves and the inverse against a double solve of the same (rounded) A apart from the kernel
  // (Eigen's FullPivLU), with κ₁(A) from that one: 4·√n·u·κ₁ relative (see check_inverse for
  // the √n), required below 0.05 so that a solve 5 % off fails.
  const Eigen::MatrixXd Ad = A.template cast<double>();
  const double kappa = bd_test::norm1(Ad) * bd_test::norm1(bd_test::reference::inverse(Ad));
  const double solve_bound = 4.0 * std::sqrt(double(n)) * u * kappa;
  INFO("κ₁ = " << kappa << ", solve bound " << solve_bound);
  REQUIRE(solve_bound < 0.05);
  const Dense<T> B = bd_test::gaussian(n, 3, unsigned(n) + 11).cast<T>();
  const auto solve_error = [&](const Dense<T>& got, const Eigen::MatrixXd& want) {
    return (got.template cast<double>() - want).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() / want.cwiseAbs().maxCoeff();
  };
  CHECK(solve_error(lu.solve(B), bd_test::reference::solve(Ad, B.template cast<double>())) <= solve_bound);
  CHECK(solve_error(lu.solve_transposed(B), bd_test::reference::solve(Ad.transpose(), B.template cast<double>())) <= solve_bound);
  bd_test::check_inverse(Ad, lu.inverse().template cast<double>(), u);
  // Same estimator (Hager–Higham, LAPACK xGECON); rounding may steer it to another bound.
  const double ref_rcond = bd_test::reference::lu_rcond(A);
  CHECK(lu.rcond() >= 0.5 * ref_rcond);
  CHECK(lu.rcond() <= 2.0 * ref_rcond);
}

}  // namespace

TEST_CASE("SmallLU: P·A = L·U, backward stable, in float and double on every kernel", "[kernel][small_lu]") {
  bd_test::for_each_isa([] {
    for (Eigen::Index n : {1, 2, 5, 8, 15, 16, 17, 31, 33, 64, 100, 128, 131}) {
      INFO("n = " << n);
      const Eigen::MatrixXd A = bd_test::gaussian(n, n, unsigned(n) * 3 + 1);
      check_factorization<double>(A);
      check_factorization<float>(A.cast<float>());
    }
  });
}

TEST_CASE("SmallLU: storage is reused across sizes and a singular matrix reads as singular", "[kernel][small_lu]") {
  bd_test::for_each_isa([] {
    bd::kernel::SmallLU<float> lu;
    for (Eigen::Index n : {128, 17, 128}) {
      const Eigen::MatrixXf A = bd_test::gaussian(n, n, unsigned(n)).cast<float>();
      lu.compute(A);
      CHECK(lu.size() == n);
      CHECK((lu.solve(A) - Eigen::MatrixXf::Identity(n, n)).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() < 1e-2f);
    }
    Eigen::MatrixXf S = bd_test::gaussian(40, 40, 5).cast<float>();
    S.col(7).setZero();  // an exactly singular matrix: a zero pivot, rcond 0
    CHECK(lu.compute(S).rcond() == 0.0);
    S = bd_test::gaussian(40, 40, 6).cast<float>();
    S.row(30) = S.row(3);  // two equal rows: singular to rounding
    CHECK(lu.compute(S).rcond() < 1e-6);
  });
}
