// bd::kernel's inverses (preparation's r×r blocks) are inverses to the accuracy of a
// backward-stable solve: ‖A·A⁻¹ − I‖ ≤ c·n·u·κ(A), at sizes on and off the row-wise triangular
// inverse's blocks of 4 rows and its 16-wide rows, on every micro-kernel this CPU runs.
#include <cmath>

#include <bd/kernel/inverse.hpp>
#include <bd/kernel/small_lu.hpp>

#include "support.hpp"

namespace {

// Residual of a computed inverse against the identity, relative to κ₁(A)·n·u: a stable inverse
// stays below a small constant (Higham, Accuracy and Stability, §14); 16 leaves room for the
// 1-norm's estimate.
// `u` is the unit of the arithmetic the inverse was computed in (the residual itself in double).
double scaled_residual(const Eigen::MatrixXd& A, const Eigen::MatrixXd& inv,
                       double u = Eigen::NumTraits<double>::epsilon()) {
  const Eigen::Index n = A.rows();
  const double kappa = A.cwiseAbs().colwise().sum().maxCoeff() * inv.cwiseAbs().colwise().sum().maxCoeff();
  const double residual = (A * inv - Eigen::MatrixXd::Identity(n, n)).cwiseAbs().colwise().sum().maxCoeff();
  return residual / (kappa * double(n) * u);
}

}  // namespace

TEST_CASE("inverse from an LU and from a Cholesky factor, on the kernel", "[kernel][inverse]") {
  bd_test::for_each_isa([] {
    for (Eigen::Index n : {1, 5, 24, 25, 48, 49, 97, 128, 131, 200}) {
      INFO("n = " << n);
      const Eigen::MatrixXd A = bd_test::gaussian(n, n, unsigned(n));
      const Eigen::PartialPivLU<Eigen::MatrixXd> lu(A);
      const Eigen::MatrixXd inv = bd::kernel::inverse(lu);
      CHECK(scaled_residual(A, inv) < 16);
      CHECK((inv - lu.inverse()).cwiseAbs().maxCoeff() <= 1e-9 * inv.cwiseAbs().maxCoeff());

      const Eigen::MatrixXd S = A * A.transpose() + double(n) * Eigen::MatrixXd::Identity(n, n);
      const Eigen::LLT<Eigen::MatrixXd> llt(S);
      const Eigen::MatrixXd Sinv = bd::kernel::inverse(llt);
      CHECK(scaled_residual(S, Sinv) < 16);
      CHECK(Sinv == Sinv.transpose());
    }
  });
}

TEST_CASE("inverse in float (window ranking) is as stable as in double, at float's unit", "[kernel][inverse]") {
  bd_test::for_each_isa([] {
    for (Eigen::Index n : {1, 5, 49, 128, 131}) {
      INFO("n = " << n);
      const Eigen::MatrixXf A = bd_test::gaussian(n, n, unsigned(n) + 7).cast<float>();
      const Eigen::PartialPivLU<Eigen::MatrixXf> lu(A);
      const Eigen::MatrixXf inv = bd::kernel::inverse(lu);
      CHECK(scaled_residual(A.cast<double>(), inv.cast<double>(), Eigen::NumTraits<float>::epsilon()) < 16);
      const Eigen::MatrixXf S = A * A.transpose() + float(n) * Eigen::MatrixXf::Identity(n, n);
      const Eigen::MatrixXf Sinv = bd::kernel::inverse(Eigen::LLT<Eigen::MatrixXf>(S));
      CHECK(scaled_residual(S.cast<double>(), Sinv.cast<double>(), Eigen::NumTraits<float>::epsilon()) < 16);
      CHECK(Sinv == Sinv.transpose());
    }
  });
}

TEST_CASE("lower-triangular inverse reads only the lower triangle", "[kernel][inverse]") {
  // Sizes around the kernel's blocks of 4 rows and its rows' 16-value chunks, in both types.
  bd_test::for_each_isa([] {
    for (Eigen::Index n : {1, 2, 3, 4, 5, 15, 16, 17, 33, 150}) {
      INFO("n = " << n);
      Eigen::MatrixXd L = bd_test::gaussian(n, n, unsigned(n) + 3);
      L.diagonal().array() += 3.0 * std::sqrt(double(n)) + 1.0;  // well conditioned
      Eigen::MatrixXd garbage = L;
      garbage.triangularView<Eigen::StrictlyUpper>().setConstant(1e300);
      const Eigen::MatrixXd lower = L.triangularView<Eigen::Lower>();
      const Eigen::MatrixXd inv = bd::kernel::lower_inverse(garbage);
      CHECK(scaled_residual(lower, inv) < 16);
      CHECK(inv.triangularView<Eigen::StrictlyUpper>().toDenseMatrix().isZero(0));
      const Eigen::MatrixXd unit_inv = bd::kernel::lower_inverse<Eigen::UnitLower>(garbage);
      const Eigen::MatrixXd unit = Eigen::MatrixXd(L.triangularView<Eigen::UnitLower>());
      CHECK(scaled_residual(unit, unit_inv) < 16);
      CHECK(unit_inv.diagonal().isOnes(0));

      const Eigen::MatrixXf inv_f = bd::kernel::lower_inverse(Eigen::MatrixXf(garbage.cast<float>()));
      CHECK(scaled_residual(lower, inv_f.cast<double>(), Eigen::NumTraits<float>::epsilon()) < 16);
      CHECK(inv_f.triangularView<Eigen::StrictlyUpper>().toDenseMatrix().isZero(0));
    }
  });
}

TEST_CASE("lower-triangular inverse of a non-square or empty matrix", "[kernel][inverse]") {
  CHECK_THROWS_AS(bd::kernel::lower_inverse(Eigen::MatrixXd::Identity(4, 3)), bd::ShapeError);
  CHECK(bd::kernel::lower_inverse(Eigen::MatrixXd(0, 0)).size() == 0);
}

TEST_CASE("inverses into reused storage: transposed operands read in place, any order of sizes", "[kernel][inverse]") {
  // Preparation keeps the outputs and scratch of these per thread across products of different
  // shapes; a result must not depend on what the storage held before.
  bd_test::for_each_isa([] {
    Eigen::MatrixXd out, from_transpose;
    for (Eigen::Index n : {128, 49, 200, 5, 128}) {
      INFO("n = " << n);
      Eigen::MatrixXd L = bd_test::gaussian(n, n, unsigned(n) + 11);
      L.diagonal().array() += 3.0 * std::sqrt(double(n));
      bd::kernel::lower_inverse_into(L, out);
      CHECK(out == bd::kernel::lower_inverse(Eigen::MatrixXd(L)));
      // Lᵀᵀ: the upper triangle of the transpose, read row-major without a copy.
      const Eigen::MatrixXd Lt = L.transpose();
      bd::kernel::lower_inverse_into(Lt.transpose(), from_transpose);
      CHECK(scaled_residual(Eigen::MatrixXd(L.triangularView<Eigen::Lower>()), from_transpose) < 16);

      bd::kernel::SmallLU<double> lu(L);
      lu.inverse_into(out);
      CHECK(scaled_residual(L, out) < 16);
      CHECK(out == lu.inverse());
    }
  });
}
