// A consumer of bd: decompose a rank-4 product and check the row-first identity W = [I; C]B.
#include <bd/bd.hpp>

#include <cstdio>

int main() {
  const Eigen::MatrixXd U = Eigen::MatrixXd::Random(12, 4), V = Eigen::MatrixXd::Random(10, 4);
  const auto d = bd::decompose_product(U, V, bd::Options{}.with_basis(bd::Basis::First));
  const Eigen::MatrixXd W = U * V.transpose();
  Eigen::MatrixXd rebuilt(12, 10);
  rebuilt << d.basis(), d.coeff() * d.basis();
  const double err = (rebuilt - W).norm() / W.norm();
  std::printf("bd consumer: relative error %.3g\n", err);
  return err < 1e-12 ? 0 : 1;
}
