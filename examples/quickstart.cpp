// The README's usage example: decompose one attention head's Wv·Wo and use it.
#include <bd/bd.hpp>

#include <iostream>

int main() {
  const int d = 64, d_h = 8;
  const Eigen::MatrixXf Wv = Eigen::MatrixXf::Random(d, d_h);  // value projection of one head
  const Eigen::MatrixXf Wo = Eigen::MatrixXf::Random(d_h, d);  // its rows of the output projection

  // W = Wv·Wo (d×d, rank d_h) = P·[I; C]·B: d_h rows of W and the coefficients of the others.
  bd::Options opts;
  opts.basis = bd::Basis::OffsetSearch;  // best window at a multiple of opts.align
  opts.align = 8;
  const bd::Decomposition<Eigen::half> vo = bd::decompose_product<Eigen::half>(Wv, Wo.transpose(), opts);

  std::cout << "basis rows " << vo.offset() << ".." << vo.offset() + vo.rank() - 1 << " of " << vo.rows()
            << ", parameters " << vo.parameters() << " instead of " << d * d_h * 2 << "\n"
            << "NMSE in f16 " << vo.report().nmse << " (rounding W itself to f16: " << vo.report().floor_nmse << ")\n";

  // x·W without W: h = x[window] + x[rest]·C, then y = h·B.
  const Eigen::RowVectorXf x = Eigen::RowVectorXf::Random(d);
  Eigen::RowVectorXf x_rest(d - d_h);
  for (int k = 0; k < d - d_h; ++k) x_rest(k) = x(vo.rest()[k]);
  const Eigen::RowVectorXf h = x.segment(vo.offset(), d_h) + x_rest * vo.coeff().cast<float>();
  const Eigen::RowVectorXf y = h * vo.basis().cast<float>();
  const Eigen::RowVectorXf y_dense = x * (Wv * Wo);
  const float rel = (y - y_dense).norm() / y_dense.norm();
  std::cout << "relative error of x·W through BD: " << rel << "\n";
  return rel < 1e-2f ? 0 : 1;  // f16 storage: a few units of 2^-11
}
