// bd::kernel's inverses (preparation's r×r blocks) are inverses to the accuracy of a
// backward-stable solve — against an inverse computed apart from them (Eigen's FullPivLU in
// double), with κ(A) from that one (bd_test::check_inverse) — at sizes on and off the row-wise
// triangular inverse's blocks of 4 rows and its 16-wide rows, on every micro-kernel this CPU runs.
#include <cmath>

#include <bd/kernel/inverse.hpp>
#include <bd/kernel/small_lu.hpp>

#include "support.hpp"

using Catch::Contains;

namespace {

constexpr double kDouble = Eigen::NumTraits<double>::epsilon();
constexpr double kFloat = Eigen::NumTraits<float>::epsilon();

}  // namespace

TEST_CASE("inverse from an LU and from a Cholesky factor, on the kernel", "[kernel][inverse]") {
  bd_test::for_each_isa([] {
    for (Eigen::Index n : {1, 5, 24, 25, 48, 49, 97, 128, 131, 200}) {
      INFO("n = " << n);
      const Eigen::MatrixXd A = bd_test::gaussian(n, n, unsigned(n));
      const Eigen::PartialPivLU<Eigen::MatrixXd> lu(A);
      const Eigen::MatrixXd inv = bd::kernel::inverse(lu);
      bd_test::check_inverse(A, inv, kDouble);
      CHECK((inv - lu.inverse()).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() <= 1e-9 * inv.cwiseAbs().maxCoeff());

      const Eigen::MatrixXd S = A * A.transpose() + double(n) * Eigen::MatrixXd::Identity(n, n);
      const Eigen::LLT<Eigen::MatrixXd> llt(S);
      const Eigen::MatrixXd Sinv = bd::kernel::inverse(llt);
      bd_test::check_inverse(S, Sinv, kDouble);
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
      bd_test::check_inverse(A.cast<double>(), inv.cast<double>(), kFloat);
      const Eigen::MatrixXf S = A * A.transpose() + float(n) * Eigen::MatrixXf::Identity(n, n);
      const Eigen::MatrixXf Sinv = bd::kernel::inverse(Eigen::LLT<Eigen::MatrixXf>(S));
      bd_test::check_inverse(S.cast<double>(), Sinv.cast<double>(), kFloat);
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
      // Well conditioned: a random triangular matrix's κ grows exponentially with n (1.9e14 at
      // n = 150 with unit entries); off-diagonals of 1/√n and a diagonal of 3√n + 1 make it
      // diagonally dominant by rows, κ₁ of order one.
      L.triangularView<Eigen::StrictlyLower>() *= 1.0 / std::sqrt(double(n));
      L.diagonal().array() += 3.0 * std::sqrt(double(n)) + 1.0;
      Eigen::MatrixXd garbage = L;
      garbage.triangularView<Eigen::StrictlyUpper>().setConstant(1e300);
      const Eigen::MatrixXd lower = L.triangularView<Eigen::Lower>();
      const Eigen::MatrixXd inv = bd::kernel::lower_inverse(garbage);
      bd_test::check_inverse(lower, inv, kDouble);
      CHECK(inv.triangularView<Eigen::StrictlyUpper>().toDenseMatrix().isZero(0));
      const Eigen::MatrixXd unit_inv = bd::kernel::lower_inverse<Eigen::UnitLower>(garbage);
      const Eigen::MatrixXd unit = Eigen::MatrixXd(L.triangularView<Eigen::UnitLower>());
      bd_test::check_inverse(unit, unit_inv, kDouble);
      CHECK(unit_inv.diagonal().isOnes(0));

      const Eigen::MatrixXf inv_f = bd::kernel::lower_inverse(Eigen::MatrixXf(garbage.cast<float>()));
      bd_test::check_inverse(Eigen::MatrixXd(Eigen::MatrixXf(lower.cast<float>()).cast<double>()), inv_f.cast<double>(), kFloat);
      CHECK(inv_f.triangularView<Eigen::StrictlyUpper>().toDenseMatrix().isZero(0));
    }
  });
}

TEST_CASE("lower-triangular inverse of a non-square or empty matrix", "[kernel][inverse]") {
  BD_CHECK_THROWS_CONTAINING(bd::kernel::lower_inverse(Eigen::MatrixXd::Identity(4, 3)), bd::ShapeError,
                             Contains("L is 4x3, expected a square matrix"));
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
      L.triangularView<Eigen::StrictlyLower>() *= 1.0 / std::sqrt(double(n));  // well conditioned, as above
      L.diagonal().array() += 3.0 * std::sqrt(double(n));
      bd::kernel::lower_inverse_into(L, out);
      CHECK(out == bd::kernel::lower_inverse(Eigen::MatrixXd(L)));
      // Lᵀᵀ: the upper triangle of the transpose, read row-major without a copy.
      const Eigen::MatrixXd Lt = L.transpose();
      bd::kernel::lower_inverse_into(Lt.transpose(), from_transpose);
      bd_test::check_inverse(Eigen::MatrixXd(L.triangularView<Eigen::Lower>()), from_transpose, kDouble);

      bd::kernel::SmallLU<double> lu(L);
      lu.inverse_into(out);
      bd_test::check_inverse(L, out, kDouble);
      CHECK(out == lu.inverse());
    }
  });
}
