// support.hpp's helpers and references, compiled once per test build (bd_test_support) instead
// of in every test file.
#include "support.hpp"

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <random>

#include <Eigen/LU>
#include <Eigen/QR>

namespace bd_test {

Eigen::MatrixXd gaussian(Eigen::Index rows, Eigen::Index cols, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  return Eigen::MatrixXd::NullaryExpr(rows, cols, [&]() { return normal(rng); });
}

Eigen::MatrixXd Product::W() const { return U * V.transpose(); }

Product random_product(Eigen::Index m, Eigen::Index n, Eigen::Index r, unsigned seed) {
  return {gaussian(m, r, seed), gaussian(n, r, seed + 7919)};
}

double norm1(const Eigen::MatrixXd& A) { return A.cwiseAbs().colwise().sum().maxCoeff(); }

void check_inverse(const Eigen::MatrixXd& A, const Eigen::MatrixXd& X, double u) {
  const Eigen::Index n = A.rows();
  REQUIRE(X.rows() == n);
  REQUIRE(X.cols() == n);
  const Eigen::MatrixXd exact = reference::inverse(A);
  const double kappa = norm1(A) * norm1(exact);
  const double bound = 4.0 * std::sqrt(double(n)) * u * kappa;
  INFO("n = " << n << ", κ₁ = " << kappa << ", bound " << bound);
  REQUIRE(bound < 0.05);
  CHECK(norm1(X - exact) <= bound * norm1(exact));
  CHECK(norm1(A * X - Eigen::MatrixXd::Identity(n, n)) <= bound);
}

namespace reference {

Eigen::MatrixXd inverse(const Eigen::MatrixXd& A) { return A.fullPivLu().inverse(); }

Eigen::MatrixXd solve(const Eigen::MatrixXd& A, const Eigen::MatrixXd& B) { return A.fullPivLu().solve(B); }

Eigen::MatrixXd orthonormal_columns(const Eigen::MatrixXd& G) {
  const Eigen::HouseholderQR<Eigen::MatrixXd> qr(G);
  return qr.householderQ() * Eigen::MatrixXd::Identity(G.rows(), G.cols());
}

std::vector<Eigen::Index> column_pivots(const Eigen::MatrixXd& A) {
  const Eigen::ColPivHouseholderQR<Eigen::MatrixXd> qr(A);
  const auto& p = qr.colsPermutation().indices();
  return std::vector<Eigen::Index>(p.data(), p.data() + p.size());
}

Eigen::Index rank(const Eigen::MatrixXd& A) { return Eigen::ColPivHouseholderQR<Eigen::MatrixXd>(A).rank(); }

double llt_rcond(const Eigen::MatrixXd& A) { return Eigen::LLT<Eigen::MatrixXd>(A).rcond(); }
double llt_rcond(const Eigen::MatrixXf& A) { return double(Eigen::LLT<Eigen::MatrixXf>(A).rcond()); }
double lu_rcond(const Eigen::MatrixXd& A) { return Eigen::PartialPivLU<Eigen::MatrixXd>(A).rcond(); }
double lu_rcond(const Eigen::MatrixXf& A) { return double(Eigen::PartialPivLU<Eigen::MatrixXf>(A).rcond()); }

}  // namespace reference

std::string models_dir() {
  if (const char* env = std::getenv("BD_MODELS_DIR")) return env;
  return BD_MODELS_DIR;
}

std::string require_model(const std::string& name) {
  const std::string dir = models_dir() + "/" + name;
  if (!std::filesystem::exists(dir + "/model.safetensors")) {
    std::cerr << "FAILED: " << dir << "/model.safetensors not found; it ships with bd (examples/models): "
              << "is the checkout complete?\n";
    std::exit(1);
  }
  return dir;
}

}  // namespace bd_test
