// Bad input gets an exception whose message names the argument, what was found and what was
// expected. Nothing is returned half-made.
#include <limits>

#include <bd/kernel/flash_attention.hpp>
#include <bd/kernel/matmul.hpp>
#include <bd/kernel/pivoted_qr.hpp>
#include <bd/kernel/small_lu.hpp>

#include "support.hpp"

using bd::Basis;
using bd_test::random_product;
using Catch::Contains;

TEST_CASE("rank at or below zero is refused", "[bad-input]") {
  const Eigen::MatrixXd W = random_product(10, 8, 3, 1).W();
  CHECK_THROWS_MATCHES(bd::decompose(W, 0), bd::RangeError, Catch::Message(
      "rank 0 is out of range for W (10x8): expected 0 < rank < min(m, n) = 8"));
  BD_CHECK_THROWS_CONTAINING(bd::decompose(W, -2), bd::RangeError, Contains("rank -2 is out of range"));
}

TEST_CASE("rank at or above min(m, n) is refused: BD would save nothing", "[bad-input]") {
  const Eigen::MatrixXd W = random_product(10, 8, 3, 1).W();
  BD_CHECK_THROWS_CONTAINING(bd::decompose(W, 8), bd::RangeError,
                             Contains("rank 8 is out of range") && Contains("min(m, n) = 8"));
  const Eigen::MatrixXd U = bd_test::gaussian(10, 8, 1), V = bd_test::gaussian(8, 8, 2);
  BD_CHECK_THROWS_CONTAINING(bd::decompose_product(U, V), bd::RangeError,
                             Contains("rank 8 is out of range for W = U·Vᵀ (10x8)"));
}

TEST_CASE("a requested rank above W's numerical rank is refused", "[bad-input]") {
  const Eigen::MatrixXd W = random_product(12, 10, 3, 1).W();
  BD_CHECK_THROWS_CONTAINING(bd::decompose(W, 5), bd::RangeError,
                             Contains("numerical rank 3") && Contains("use rank 3"));
}

TEST_CASE("factors whose shapes disagree are refused", "[bad-input]") {
  const Eigen::MatrixXd U = bd_test::gaussian(10, 3, 1), V = bd_test::gaussian(8, 4, 2);
  CHECK_THROWS_MATCHES(bd::decompose_product(U, V), bd::ShapeError,
                       Catch::Message("factors disagree: U is 10x3 and V is 8x4, expected the same number of columns r "
                                      "(W = U·Vᵀ is m×n of rank r)"));
  std::vector<Eigen::MatrixXd> Us{U, bd_test::gaussian(11, 3, 3)}, Vs{bd_test::gaussian(8, 3, 4), bd_test::gaussian(8, 3, 5)};
  BD_CHECK_THROWS_CONTAINING(bd::decompose_shared(Us, Vs), bd::ShapeError,
                             Contains("U[1] is 11x3") && Contains("expected 10x3"));
  std::vector<Eigen::MatrixXd> one{U};
  BD_CHECK_THROWS_CONTAINING(bd::decompose_shared(one, Vs), bd::ShapeError,
                             Contains("got 1 U factors and 2 V factors"));
}

TEST_CASE("empty matrices are refused", "[bad-input]") {
  const Eigen::MatrixXd empty(0, 4), V = bd_test::gaussian(8, 4, 2);
  CHECK_THROWS_MATCHES(bd::decompose_product(empty, V), bd::ShapeError,
                       Catch::Message("U is empty (0x4): expected a matrix with at least one row and one column"));
  BD_CHECK_THROWS_CONTAINING(bd::decompose(Eigen::MatrixXd(3, 0), 1), bd::ShapeError, Contains("W is empty (3x0)"));
}

TEST_CASE("NaN weights are refused with their position", "[bad-input]") {
  auto p = random_product(10, 8, 3, 1);
  p.V(4, 2) = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_MATCHES(bd::decompose_product(p.U, p.V), bd::NonFiniteError, Catch::Message(
      "V (8x3) holds nan at (4, 2): expected finite weights (NaN/Inf usually means a corrupt or overflowed checkpoint)"));
}

TEST_CASE("Inf weights are refused, in W and in every head", "[bad-input]") {
  auto p = random_product(10, 8, 3, 1);
  Eigen::MatrixXd W = p.W();
  W(0, 7) = std::numeric_limits<double>::infinity();
  BD_CHECK_THROWS_CONTAINING(bd::decompose(W, 3), bd::NonFiniteError, Contains("W (10x8) holds inf at (0, 7)"));
  std::vector<Eigen::MatrixXd> Us{p.U, p.U}, Vs{p.V, p.V};
  Us[1](9, 0) = -std::numeric_limits<double>::infinity();
  BD_CHECK_THROWS_CONTAINING(bd::decompose_shared(Us, Vs), bd::NonFiniteError,
                             Contains("U[1] (10x3) holds -inf at (9, 0)"));
}

TEST_CASE("non-finite weights are named first and in product order, whatever else fails", "[bad-input]") {
  // Products are checked and factored in parallel; the error must not depend on which thread
  // got there first: the first non-finite product in order, even when an earlier one is
  // singular (a zero head) and a later one non-finite too.
  auto p = random_product(10, 8, 3, 1);
  std::vector<Eigen::MatrixXd> Us(6, p.U), Vs(6, p.V);
  Us[0].setZero();  // singular: every basis of head 0 is
  Vs[2](1, 1) = std::numeric_limits<double>::quiet_NaN();
  Us[4](0, 2) = std::numeric_limits<double>::infinity();
  CHECK_THROWS_MATCHES(bd::decompose_shared(Us, Vs), bd::NonFiniteError,
                       Catch::Message("V[2] (8x3) holds nan at (1, 1): expected finite weights (NaN/Inf usually means "
                                      "a corrupt or overflowed checkpoint)"));
  Vs[2] = p.V, Us[4] = p.U;
  BD_CHECK_THROWS_CONTAINING(bd::decompose_shared(Us, Vs), bd::SingularBasisError,
                             Contains("head 0: the basis-side factor (10x3) has numerical rank 0 < r = 3"));
}

TEST_CASE("align must be positive", "[bad-input]") {
  const auto p = random_product(10, 8, 3, 1);
  CHECK_THROWS_MATCHES(bd::decompose_product(p.U, p.V, bd::Options{}.with_align(0)), bd::RangeError,
                       Catch::Message("Options::align is 0: expected a positive window stride"));
  BD_CHECK_THROWS_CONTAINING(bd::decompose_product(p.U, p.V, bd::Options{}.with_align(-16)), bd::RangeError,
                             Contains("Options::align is -16: expected a positive window stride"));
}

TEST_CASE("a window outside the matrix is refused", "[bad-input]") {
  const auto p = random_product(10, 8, 3, 1);
  BD_CHECK_THROWS_CONTAINING(bd::decompose_product(p.U, p.V, bd::Options{}.with_window(8)), bd::RangeError,
                             Contains("Options::offset 8 puts the window outside the 10 rows") && Contains("0 <= offset <= 7"));
}

TEST_CASE("the error budget of auto must be positive", "[bad-input]") {
  const auto p = random_product(10, 8, 3, 1);
  BD_CHECK_THROWS_CONTAINING(bd::decompose_product(p.U, p.V, bd::Options{}.with_basis(Basis::Auto).with_error_budget(0)), bd::RangeError,
                             Contains("Options::error_budget is 0"));
  // Numbers read as std::ostream writes them: six significant digits, exponent past 1e±5.
  BD_CHECK_THROWS_CONTAINING(bd::decompose_product(p.U, p.V, bd::Options{}.with_basis(Basis::Auto).with_error_budget(-2.5e-7)),
                             bd::RangeError, Contains("Options::error_budget is -2.5e-07"));
  BD_CHECK_THROWS_CONTAINING(bd::decompose_product(p.U, p.V, bd::Options{}.with_basis(Basis::Auto).with_error_budget(-1234567.0)),
                             bd::RangeError, Contains("Options::error_budget is -1.23457e+06"));
  BD_CHECK_THROWS_CONTAINING(bd::decompose_product(p.U, p.V, bd::Options{}.with_basis(Basis::Auto).with_error_budget(-0.125)),
                             bd::RangeError, Contains("Options::error_budget is -0.125"));
}

TEST_CASE("a singular first window is refused: pruned channels", "[bad-input][singular]") {
  auto p = random_product(16, 12, 4, 3);
  p.U.row(1).setZero();  // channel 1 pruned: the first 4 rows of W are dependent
  BD_CHECK_THROWS_CONTAINING(bd::decompose_product(p.U, p.V, bd::Options{}.with_basis(Basis::First)), bd::SingularBasisError,
                             Contains("the first basis block is singular or numerically rank-deficient") &&
                                      Contains("rows 0..3"));
  // The last window does not contain the pruned channel and is fine.
  CHECK_NOTHROW(bd::decompose_product(p.U, p.V, bd::Options{}.with_basis(Basis::Last)));
}

TEST_CASE("a numerically rank-deficient last window is refused", "[bad-input][singular]") {
  auto p = random_product(16, 12, 4, 3);
  p.U.row(15) = 2.0 * p.U.row(13) - p.U.row(12) + 1e-15 * p.U.row(0);  // dependent to 1e-15
  BD_CHECK_THROWS_CONTAINING(bd::decompose_product(p.U, p.V, bd::Options{}.with_basis(Basis::Last)), bd::SingularBasisError,
                             Contains("the last basis block is singular"));
}

TEST_CASE("a zero head has no basis at all", "[bad-input][singular]") {
  const Eigen::MatrixXd U = Eigen::MatrixXd::Zero(16, 4), V = bd_test::gaussian(12, 4, 1);
  BD_CHECK_THROWS_CONTAINING(bd::decompose_product(U, V, bd::Options{}.with_basis(Basis::OffsetSearch)), bd::SingularBasisError,
                             Contains("has numerical rank 0 < r = 4") && Contains("zero, pruned or tied head"));
  std::vector<Eigen::MatrixXd> Us{bd_test::gaussian(16, 4, 2), U}, Vs{V, V};
  BD_CHECK_THROWS_CONTAINING(bd::decompose_shared(Us, Vs), bd::SingularBasisError, Contains("head 1"));
}

TEST_CASE("searching strategies skip singular windows and say how many", "[bad-input][singular]") {
  auto p = random_product(24, 12, 4, 5);
  p.U.row(2).setZero();
  p.U.row(9).setZero();  // windows starting at 0 and 8 (align 4) contain a zero channel
  const auto d = bd::decompose_product(p.U, p.V, bd::Options{}.with_basis(Basis::OffsetSearch).with_align(4));
  CHECK(d.report().windows_tried == 6);
  CHECK(d.report().windows_skipped == 2);  // rows 0..3 hold channel 2, rows 8..11 hold channel 9
  CHECK(d.offset() != 0);
  CHECK(d.offset() != 8);
  CHECK(bd_test::nmse(bd_test::rebuild(d), p.W()) < 1e-24);
}

TEST_CASE("auto falls back to pivoting when every window is singular, and says so", "[bad-input][singular]") {
  auto p = random_product(16, 12, 4, 5);
  for (Eigen::Index i : {1, 5, 9, 13}) p.U.row(i).setZero();  // one dead channel in every aligned window
  const auto d = bd::decompose_product(p.U, p.V, bd::Options{}.with_basis(Basis::Auto).with_align(4));
  CHECK(d.report().chosen == Basis::Pivoted);
  CHECK_THAT(d.report().reason, Contains("no shared window is usable"));
  CHECK(bd_test::nmse(bd_test::rebuild(d), p.W()) < 1e-24);
  BD_CHECK_THROWS_CONTAINING(bd::decompose_product(p.U, p.V, bd::Options{}.with_basis(Basis::OffsetSearch).with_align(4)), bd::SingularBasisError,
                             Contains("no offset-search window is non-singular"));
}

TEST_CASE("values beyond the storage type's range are refused, not stored as Inf", "[bad-input]") {
  auto p = random_product(12, 10, 3, 1);
  p.U *= 1e5;  // entries of W near 1e5, beyond half's 65504 (bfloat16 reaches 3e38)
  BD_CHECK_THROWS_CONTAINING(bd::decompose_product<Eigen::half>(p.U, p.V), bd::NonFiniteError,
                             Contains("overflows f16") && Contains("65504"));
  CHECK_NOTHROW(bd::decompose_product<Eigen::bfloat16>(p.U, p.V));
}

TEST_CASE("unknown strategy names are refused with the list of known ones", "[bad-input]") {
  CHECK_THROWS_MATCHES(bd::parse_basis("best"), bd::RangeError,
                       Catch::Message("unknown basis strategy 'best': expected first, last, residual-min, "
                                      "offset-search, pivoted, auto or window"));
  BD_CHECK_THROWS_CONTAINING(bd::parse_side("diagonal"), bd::RangeError,
                             Contains("unknown side 'diagonal': expected row or col"));
}

TEST_CASE("every bd exception is a std::exception", "[bad-input]") {
  const Eigen::MatrixXd W = random_product(10, 8, 3, 1).W();
  CHECK_THROWS_AS(bd::decompose(W, 0), std::exception);
  CHECK_THROWS_AS(bd::decompose(W, 0), bd::Error);
}

namespace {

// The weight scan reads exponent bits: every non-finite value at every position is found, and
// nothing finite (the largest value, subnormals, −0) is taken for one.
template <typename T>
void check_finite_scan() {
  using M = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
  using R = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  M m = M::Constant(37, 5, T(1));
  m(0, 0) = Eigen::NumTraits<T>::highest();
  m(1, 0) = Eigen::NumTraits<T>::lowest();
  m(2, 0) = std::numeric_limits<T>::denorm_min();
  m(3, 0) = T(-0.0f);
  CHECK(bd::all_finite(m));
  const T bad[] = {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
                   T(-std::numeric_limits<float>::infinity())};
  for (const T b : bad) {
    for (Eigen::Index k = 0; k < m.size(); k += 7) {
      M x = m;
      x(k % 37, k / 37) = b;
      CHECK_FALSE(bd::all_finite(x));
      CHECK_FALSE(bd::all_finite(R(x)));                  // row-major storage
      CHECK_FALSE(bd::all_finite(x.transpose()));         // read in place
      if (k % 37 < 36) CHECK_FALSE(bd::all_finite(x.topRows(36)));  // strided: Eigen's own scan
      if (k / 37 > 0) CHECK(bd::all_finite(x.leftCols(k / 37)));  // a block without the entry
    }
  }
}

}  // namespace

TEST_CASE("the finiteness scan finds every NaN and Inf, in every bd scalar type and layout", "[bad-input]") {
  check_finite_scan<float>();
  check_finite_scan<double>();
  check_finite_scan<Eigen::half>();
  check_finite_scan<Eigen::bfloat16>();
}

TEST_CASE("the kernel's public entry points refuse bad shapes with bd's errors, in every build", "[bad-input][kernel]") {
  // These were assertions (gone in Release): a wrong shape now throws whatever the build.
  const Eigen::MatrixXf a = Eigen::MatrixXf::Ones(4, 3), b = Eigen::MatrixXf::Ones(5, 2);
  Eigen::MatrixXf out(4, 2);
  BD_CHECK_THROWS_CONTAINING(bd::kernel::matmul_into(a, b, out), bd::ShapeError, Contains("a.cols() == b.rows()"));
  Eigen::MatrixXf square(4, 4);
  BD_CHECK_THROWS_CONTAINING(bd::kernel::gram_into(a, square), bd::ShapeError,
                             Contains("expected out a.cols() x a.cols()"));
  bd::kernel::GemmArguments<float, float> g;
  g.rows = 8;
  g.ldx = 4;  // a column-major X of 8 rows cannot have 4 between columns
  g.ldo = 8;
  BD_CHECK_THROWS_CONTAINING(bd::kernel::gemm(g), bd::ShapeError, Contains("ldx = 4"));
  bd::kernel::AttentionArguments<float> f;
  f.q_len = 1;
  f.k_len = 0;
  BD_CHECK_THROWS_CONTAINING(bd::kernel::flash_attention(f), bd::ShapeError, Contains("0 keys"));
  f.k_len = 1;
  f.n_q = 3;
  f.n_k = 2;
  BD_CHECK_THROWS_CONTAINING(bd::kernel::flash_attention(f), bd::ShapeError, Contains("3 query heads on 2 key"));
  bd::kernel::SmallLU<double> lu;
  BD_CHECK_THROWS_CONTAINING(lu.compute(Eigen::MatrixXd::Ones(3, 2)), bd::ShapeError,
                             Contains("expected a square matrix"));
  bd::kernel::ColumnPivots<double> pivots;
  BD_CHECK_THROWS_CONTAINING(pivots.compute(Eigen::MatrixXd::Ones(3, 2), 3), bd::RangeError,
                             Contains("0 ≤ count ≤ min(rows, cols)"));
}

TEST_CASE("storage types are parsed by name and dispatched to their scalar type", "[bad-input][storage]") {
  for (const bd::Storage s : bd::all_storages) {
    CHECK(bd::parse_storage(bd::to_string(s)) == s);
    const bd::Storage round_trip = bd::dispatch(s, [](auto tag) { return bd::storage_of<typename decltype(tag)::type>(); });
    CHECK(round_trip == s);
  }
  CHECK(bd::dispatch(bd::Storage::BF16, [](auto tag) { return sizeof(typename decltype(tag)::type); }) == 2);
  BD_CHECK_THROWS_CONTAINING(bd::parse_storage("fp16"), bd::RangeError,
                             Contains("unknown storage type 'fp16': expected f64, f32, f16 or bf16"));
}
