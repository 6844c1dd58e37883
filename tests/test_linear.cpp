// BDLinear equals the low-rank layer it replaces and saves r/(d_in + d_out) of it.
#include <bd/nn/bd_linear.hpp>

#include <cmath>


#include "nn_support.hpp"

using bd::nn::BDLinear;
using bd::nn::LowRankLinear;
using bd_test::max_rel;
using Catch::Contains;

TEST_CASE("BDLinear from a low-rank layer equals it, bias included", "[linear]") {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    const Eigen::MatrixXf U = (bd_test::gaussian(96, 16, seed) / 10).cast<float>();
    const Eigen::MatrixXf V = (bd_test::gaussian(80, 16, seed + 50) / 4).cast<float>();
    const Eigen::VectorXf b = bd_test::gaussian(80, 1, seed + 99).cast<float>();
    const LowRankLinear<float> layer(U, V, b);
    for (bd::Basis basis : {bd::Basis::First, bd::Basis::OffsetSearch, bd::Basis::Pivoted}) {
      const auto bd_layer = BDLinear<float>::from_low_rank(layer, bd::Options{}.with_basis(basis));
      const Eigen::MatrixXf x = bd_test::gaussian(7, 96, seed + 7).cast<float>();
      CHECK(max_rel(bd_layer.forward(x), layer.forward(x)) <= bd_test::kFp32OperatorBound);
      // r(d_in + d_out − r) against r(d_in + d_out): a saving of r/(d_in + d_out).
      CHECK(bd_layer.parameters() == 16 * (96 + 80 - 16));
      CHECK(1.0 - double(bd_layer.parameters()) / double(layer.parameters()) == Approx(16.0 / (96 + 80)));
    }
  }
}

TEST_CASE("BDLinear equals the low-rank layer on every kernel path, packed and decoding sizes", "[linear][kernel]") {
  // Long enough depths for several passes of the packed kernel (d_in = 900 > kc), a rank that
  // leaves partial micro-tiles, a pivoted basis (scattered S and R), a bias, 1…300 tokens.
  const Eigen::MatrixXf U = (bd_test::gaussian(900, 37, 5) / 30).cast<float>();
  const Eigen::MatrixXf V = (bd_test::gaussian(260, 37, 6) / 6).cast<float>();
  const Eigen::VectorXf b = bd_test::gaussian(260, 1, 7).cast<float>();
  const LowRankLinear<float> layer(U, V, b);
  const auto bd_layer = BDLinear<float>::from_low_rank(layer, bd::Options{}.with_basis(bd::Basis::Pivoted));
  bd_test::for_each_isa([&] {
    for (Eigen::Index L : {1, 4, 5, 33, 300}) {
      INFO("L = " << L);
      const Eigen::MatrixXf x = bd_test::gaussian(L, 900, unsigned(L)).cast<float>();
      CHECK(max_rel(bd_layer.forward(x), layer.forward(x)) <= bd_test::kFp32OperatorBound);
      Eigen::MatrixXf y = Eigen::MatrixXf::Constant(L, 260, 7.0f);  // every entry must be written
      bd_layer.forward_into(x, y);
      CHECK(y == bd_layer.forward(x));
    }
  });
  Eigen::MatrixXf wrong(3, 259);
  BD_CHECK_THROWS_CONTAINING(bd_layer.forward_into(Eigen::MatrixXf::Ones(3, 900), wrong), bd::ShapeError,
                             Contains("BDLinear output is 3x259, expected 3x260"));
}

TEST_CASE("BDLinear from a dense W: truncation error reported apart from the BD error", "[linear]") {
  // W with a known SVD, W = Q1·diag(σ)·Q2ᵀ (Q1, Q2 orthonormal, from QR of Gaussians), σ_k = 2^(−k/4):
  // its best rank-12 approximation is the first 12 terms (Eckart–Young), and the truncation drops
  // Σ_{k ≥ 12} σ_k². The gap σ_11/σ_12 = 2^(1/4) keeps that subspace well conditioned.
  const Eigen::MatrixXd Q1 = bd_test::reference::orthonormal_columns(bd_test::gaussian(64, 48, 3));
  const Eigen::MatrixXd Q2 = bd_test::reference::orthonormal_columns(bd_test::gaussian(48, 48, 5));
  Eigen::VectorXd sigma(48);
  for (Eigen::Index k = 0; k < 48; ++k) sigma(k) = std::pow(2.0, -double(k) / 4);
  const Eigen::MatrixXd W = Q1 * sigma.asDiagonal() * Q2.transpose();
  const Eigen::MatrixXd W12 = Q1.leftCols(12) * sigma.head(12).asDiagonal() * Q2.leftCols(12).transpose();
  const auto layer = BDLinear<double>::from_dense(W, 12);
  CHECK(layer.truncation_nmse() == Approx(sigma.tail(36).squaredNorm() / sigma.squaredNorm()).epsilon(1e-10));
  CHECK((W - W12).squaredNorm() / W.squaredNorm() == Approx(layer.truncation_nmse()).epsilon(1e-10));
  BD_CHECK_THROWS_CONTAINING(bd::truncated_svd<double>(W, 49), bd::RangeError,
                             Contains("truncated_svd: rank 49 of a 64x48 matrix; expected 1 to 48"));
  CHECK(layer.report().nmse < 1e-24);  // BD itself is exact for the rank-12 truncation
  const Eigen::MatrixXd x = bd_test::gaussian(5, 64, 4);
  CHECK(max_rel(layer.forward(x), x * W12) < 1e-12);
}

namespace {

// BD stored in S errs like the low-rank layer it replaces stored in S: B and C each carry one
// rounding, as U and V do, and with a pivoted basis |C| ≤ 1 does not amplify them. Held to 3× the
// dense twin's own error in S, measured on the same input (as the attention layer is).
template <typename S>
void check_rounded_like_dense(const LowRankLinear<double>& layer, const Eigen::MatrixXd& x) {
  const Eigen::MatrixXd exact = layer.forward(x);
  const LowRankLinear<S> twin(layer.U().cast<S>(), Eigen::MatrixXd(layer.V()).cast<S>());
  const double dense_error = max_rel(twin.forward(x.cast<float>()), exact);
  const auto bd_layer = BDLinear<S>::from_low_rank(layer, bd::Options{}.with_basis(bd::Basis::Pivoted));
  const double bd_error = max_rel(bd_layer.forward(x.cast<float>()), exact);
  INFO("dense twin in " << bd::to_string(bd::storage_of<S>()) << ": " << dense_error << ", BD: " << bd_error);
  CHECK(dense_error > 0);
  CHECK(bd_error <= 3 * dense_error);
}

}  // namespace

TEST_CASE("BDLinear in half and bfloat16 storage errs like the low-rank layer stored so", "[linear][precision]") {
  const LowRankLinear<double> layer(bd_test::gaussian(64, 8, 1) / 8, bd_test::gaussian(48, 8, 2) / 3);
  const Eigen::MatrixXd x = bd_test::gaussian(6, 64, 3);
  check_rounded_like_dense<Eigen::half>(layer, x);
  check_rounded_like_dense<Eigen::bfloat16>(layer, x);
}

TEST_CASE("BDLinear refuses bad shapes and ranks", "[linear][bad-input]") {
  BD_CHECK_THROWS_CONTAINING(LowRankLinear<float>(Eigen::MatrixXf::Ones(4, 2), Eigen::MatrixXf::Ones(5, 3)), bd::ShapeError,
                             Contains("expected the same rank r"));
  BD_CHECK_THROWS_CONTAINING(BDLinear<float>::from_dense(Eigen::MatrixXd::Ones(6, 5), 5), bd::RangeError,
                             Contains("rank 5 is out of range"));
  const LowRankLinear<float> layer(Eigen::MatrixXf::Random(10, 2), Eigen::MatrixXf::Random(8, 2));
  const auto bd_layer = BDLinear<float>::from_low_rank(layer);
  BD_CHECK_THROWS_CONTAINING(bd_layer.forward(Eigen::MatrixXf::Ones(2, 9)), bd::ShapeError,
                             Contains("input has 9 columns, expected 10"));
}
