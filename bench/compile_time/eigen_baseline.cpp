// The yardstick of bench/compile_time/measure.sh: a program that uses Eigen's heavy machinery
// (column-pivoted QR, Jacobi SVD, partial-pivoting LU and products, in double and float) and no
// bd. A header-only library's user program should compile in about this time.
#include <Eigen/Dense>
#include <iostream>
int main() {
  Eigen::MatrixXd A = Eigen::MatrixXd::Random(200, 200);
  Eigen::ColPivHouseholderQR<Eigen::MatrixXd> qr(A);
  Eigen::JacobiSVD<Eigen::MatrixXd> svd(A, Eigen::ComputeThinU | Eigen::ComputeThinV);
  Eigen::PartialPivLU<Eigen::MatrixXd> lu(A);
  Eigen::MatrixXf B = Eigen::MatrixXf::Random(100, 100);
  Eigen::MatrixXf C = B * B.transpose();
  Eigen::ColPivHouseholderQR<Eigen::MatrixXf> qrf(B);
  Eigen::JacobiSVD<Eigen::MatrixXf> svdf(B, Eigen::ComputeThinU | Eigen::ComputeThinV);
  Eigen::PartialPivLU<Eigen::MatrixXf> luf(B);
  std::cout << qr.rank() << svd.singularValues()(0) << lu.determinant() << C.sum() << qrf.rank() << svdf.singularValues()(0) << luf.determinant() << "\n";
}
