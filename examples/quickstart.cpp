// The README's usage example: decompose one attention head's Wv·Wo and use it.
#include <bd/bd.hpp>

#include <iostream>

int main() {
  const int d = 64, d_h = 8;
  const Eigen::MatrixXf Wv = Eigen::MatrixXf::Random(d, d_h);  // value projection of one head
  const Eigen::MatrixXf Wo = Eigen::MatrixXf::Random(d_h, d);  // its rows of the output projection

  // W = Wv·Wo (d×d, rank d_h) as d_h of its rows (the basis B) and the coefficients C of the others.
  const bd::Decomposition<Eigen::half> vo = bd::decompose_product<Eigen::half>(Wv, Wo.transpose());
  std::cout << vo.report().reason << "\n"
            << "parameters " << vo.parameters() << " instead of " << d * d_h * 2 << "; NMSE in f16 " << vo.report().nmse
            << " (rounding W itself to f16: " << vo.report().floor_nmse << ")\n";

  // x·W without W: (x[:, basis rows] + x[:, other rows]·C)·B, for one row or a block of rows.
  const Eigen::RowVectorXf x = Eigen::RowVectorXf::Random(d);
  const Eigen::RowVectorXf y = vo.apply(x), y_dense = x * (Wv * Wo);
  const float rel = (y - y_dense).norm() / y_dense.norm();
  std::cout << "relative error of x·W through BD: " << rel << "\n";
  return rel < 1e-2f ? 0 : 1;  // f16 storage: a few units of 2^-11
}
