// bd::kernel::matmul, preparation's product, equals Eigen's a·b for every storage order the
// kernel reads in place (a transposed operand is packed from its rows, not copied), for odd
// shapes around the micro-tiles and the blocking, float and double, on every micro-kernel this
// CPU runs; an expression without direct access is evaluated first.
#include <bd/kernel/matmul.hpp>

#include <cmath>
#include <limits>
#include <type_traits>

#include "support.hpp"

namespace {

template <typename T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;

// The product of a and b held entrywise to Eigen's product of the same operands in double:
// |got − a·b|ᵢⱼ ≤ c·√K·u·(|a|·|b|)ᵢⱼ. The worst case of a depth-K sum is K·u·(|a||b|)ᵢⱼ (Higham,
// §3.5); rounding errors of random sign grow like √K (§2.8), and c = 4 leaves room for the
// blocking's partial sums; for double, c = 8 covers the reference's own rounding too. Entrywise,
// against the operands' magnitudes, so that a kernel that packed its float operands in bf16 or
// fp16 (u 2⁻⁸ or 2⁻¹¹), or its double operands in float, fails at every depth tried here.
template <typename T>
void expect_product(const Mat<T>& got, const Eigen::MatrixXd& a, const Eigen::MatrixXd& b) {
  REQUIRE(got.rows() == a.rows());
  REQUIRE(got.cols() == b.cols());
  const double c = std::is_same_v<T, double> ? 8.0 : 4.0;
  const Eigen::MatrixXd magnitude = a.cwiseAbs() * b.cwiseAbs();
  const Eigen::ArrayXXd bound = c * std::sqrt(double(a.cols())) * double(Eigen::NumTraits<T>::epsilon()) * magnitude.array();
  const Eigen::ArrayXXd error = (got.template cast<double>() - a * b).array().abs();
  INFO("worst error / bound: " << (error / bound).maxCoeff());
  CHECK((error <= bound).all());
}

template <typename T>
Eigen::MatrixXd wide(const Mat<T>& m) {
  return m.template cast<double>();
}

template <typename T>
void check_orders(Eigen::Index L, Eigen::Index K, Eigen::Index N, unsigned seed) {
  INFO("L = " << L << ", K = " << K << ", N = " << N);
  const Mat<T> a = bd_test::gaussian(L, K, seed).cast<T>(), b = bd_test::gaussian(K, N, seed + 1).cast<T>();
  const Mat<T> at = a.transpose(), bt = b.transpose();
  const Eigen::MatrixXd A = wide(a), B = wide(b);
  expect_product<T>(bd::kernel::matmul(a, b), A, B);
  expect_product<T>(bd::kernel::matmul(at.transpose(), b), A, B);              // X row-major
  expect_product<T>(bd::kernel::matmul(a, bt.transpose()), A, B);              // B row-major
  expect_product<T>(bd::kernel::matmul(at.transpose(), bt.transpose()), A, B); // both
  // Blocks with a leading dimension larger than their rows, and an expression without direct
  // access (evaluated first).
  const Mat<T> wider = bd_test::gaussian(L + 5, K + 3, seed + 2).cast<T>();
  expect_product<T>(bd::kernel::matmul(wider.block(2, 1, L, K), b), wide<T>(wider.block(2, 1, L, K)), B);
  expect_product<T>(bd::kernel::matmul(T(2) * a, b), 2.0 * A, B);
  // Into a block of a larger output, columns outside it untouched.
  Mat<T> out = Mat<T>::Constant(L, N + 2, T(7));
  auto inner = out.middleCols(1, N);
  bd::kernel::matmul_into(at.transpose(), b, inner);
  expect_product<T>(Mat<T>(out.middleCols(1, N)), A, B);
  CHECK((out.col(0).array() == T(7)).all());
  CHECK((out.col(N + 1).array() == T(7)).all());
}

}  // namespace

TEST_CASE("matmul: every storage order equals Eigen's product, float and double", "[kernel][matmul]") {
  bd_test::for_each_isa([] {
    // The first four are below matmul_threshold or at most skinny_rows rows (dot products,
    // product_small); the rest go through the packed GEMM.
    for (auto [L, K, N] : {std::tuple<int, int, int>{1, 1, 1}, {17, 9, 23}, {63, 64, 65}, {3, 700, 90}, {128, 128, 128},
                           {131, 97, 45}, {37, 513, 29}, {200, 64, 700}, {65, 1000, 13}}) {
      check_orders<double>(L, K, N, 11u + unsigned(L));
      check_orders<float>(L, K, N, 17u + unsigned(L));
    }
  });
}

TEST_CASE("matmul: a small product adds into its output, and an empty depth gives zeros", "[kernel][matmul]") {
  bd_test::for_each_isa([] {
    const Mat<double> a = bd_test::gaussian(21, 13, 3), b = bd_test::gaussian(13, 30, 4), c = bd_test::gaussian(21, 30, 5);
    Mat<double> out = c;
    bd::kernel::matmul_add_into(a, b, out);
    // out − c is the product to within the sum's rounding, |c| adding one rounding per entry.
    const Eigen::ArrayXXd bound = 8.0 * std::sqrt(13.0) * std::numeric_limits<double>::epsilon() *
                                  ((a.cwiseAbs() * b.cwiseAbs()).array() + c.array().abs());
    CHECK(((out - c - a * b).array().abs() <= bound).all());
    Mat<float> empty = Mat<float>::Constant(4, 5, 7.0f);
    bd::kernel::matmul_into(Mat<float>(4, 0), Mat<float>(0, 5), empty);
    CHECK((empty.array() == 0.0f).all());
  });
}

TEST_CASE("matmul: a Gram VᵀV read in place is exactly what the copied transpose gives", "[kernel][matmul]") {
  // Same kernel, same packing values, same order: reading Vᵀ in place changes nothing.
  bd_test::for_each_isa([] {
    const Mat<double> V = bd_test::gaussian(2048, 128, 5);
    const Mat<double> copied = bd::kernel::matmul(Mat<double>(V.transpose()), V);
    CHECK(bd::kernel::matmul(V.transpose(), V) == copied);
  });
}

namespace {

// gram_into computes only the tiles meeting the lower triangle; the lower triangle must be what
// the full product gives (same kernel, same packing, same order: bit for bit), the upper its
// mirror, for sizes around the micro-tile edges (float 32×12 / 16×12 double on AVX-512, others on
// AVX2) and a transposed operand read in place.
template <typename T>
void check_gram(Eigen::Index K, Eigen::Index N, unsigned seed) {
  INFO("K = " << K << ", N = " << N);
  const Mat<T> a = bd_test::gaussian(K, N, seed).cast<T>();
  const Mat<T> full = bd::kernel::matmul(a.transpose(), a);
  // Poisoned output: a tile the kernel should have written but skipped would keep the NaN.
  Mat<T> g = Mat<T>::Constant(N, N, std::numeric_limits<T>::quiet_NaN());
  bd::kernel::gram_into(a, g);
  CHECK(g.allFinite());
  CHECK(g == Mat<T>(g.transpose()));  // exactly symmetric
  CHECK(Mat<T>(g.template triangularView<Eigen::Lower>()) == Mat<T>(full.template triangularView<Eigen::Lower>()));
  const Eigen::MatrixXd A = wide(a);
  expect_product<T>(g, A.transpose(), A);
  // The transposed operand: gram(aᵀ) = a·aᵀ, read in place.
  const Mat<T> at = a.transpose();
  expect_product<T>(bd::kernel::gram(at.transpose()), A.transpose(), A);
  if (K > 600) return;  // a·aᵀ of the tall shapes is a large product, no other path
  const Mat<T> outer = bd::kernel::gram(a.transpose());
  expect_product<T>(outer, A, A.transpose());
  CHECK(outer == Mat<T>(outer.transpose()));
}

}  // namespace

TEST_CASE("gram: aᵀa from its lower triangle equals the full product there, mirrored exactly", "[kernel][matmul]") {
  bd_test::for_each_isa([] {
    for (auto [K, N] : {std::pair<int, int>{2048, 128}, {384, 256}, {97, 45}, {513, 131}, {64, 33}, {3, 200}, {40, 4}}) {
      check_gram<float>(K, N, 23u + unsigned(N));
      check_gram<double>(K, N, 29u + unsigned(N));
    }
  });
}

TEST_CASE("matmul_upper: a·u for an upper-triangular u equals the dense product", "[kernel][matmul]") {
  // Each column block reads only u's rows above its last column; the rows left out hold zeros.
  bd_test::for_each_isa([] {
    for (auto [L, N] : {std::pair<int, int>{512, 128}, {300, 130}, {97, 45}, {40, 5}, {9, 1}}) {
      INFO("L = " << L << ", N = " << N);
      const Eigen::MatrixXd a = bd_test::gaussian(L, N, 31u + unsigned(N));
      const Eigen::MatrixXd u = bd_test::gaussian(N, N, 37u + unsigned(L)).triangularView<Eigen::Upper>();
      Eigen::MatrixXd got = Eigen::MatrixXd::Constant(L, N, 7.0);
      bd::kernel::matmul_upper_into(a, u, got);
      expect_product<double>(got, a, u);
      // Read in place from the transpose of a lower-triangular matrix, as Cholesky QR does.
      const Eigen::MatrixXd l = u.transpose();
      got.setConstant(7.0);
      bd::kernel::matmul_upper_into(a, l.transpose(), got);
      expect_product<double>(got, a, u);
    }
  });
}

TEST_CASE("matmul_lower: a·l for a lower-triangular l equals the dense product", "[kernel][matmul]") {
  // Each column block reads only l's rows from its first column on; the rows left out hold zeros.
  bd_test::for_each_isa([] {
    for (auto [L, N] : {std::pair<int, int>{128, 128}, {300, 130}, {97, 45}, {40, 5}, {9, 1}}) {
      INFO("L = " << L << ", N = " << N);
      const Eigen::MatrixXd a = bd_test::gaussian(L, N, 41u + unsigned(N));
      const Eigen::MatrixXd l = bd_test::gaussian(N, N, 43u + unsigned(L)).triangularView<Eigen::Lower>();
      Eigen::MatrixXd got = Eigen::MatrixXd::Constant(L, N, 7.0);
      bd::kernel::matmul_lower_into(a, l, got);
      expect_product<double>(got, a, l);
      // a read in place as the transpose of another matrix, as the inverse from an LU reads U⁻¹.
      const Eigen::MatrixXd at = a.transpose();
      got.setConstant(7.0);
      bd::kernel::matmul_lower_into(at.transpose(), l, got);
      expect_product<double>(got, a, l);
    }
  });
}
