// The paper's identities (Eq. 2) hold exactly: in double, BD of a random rank-r product rebuilds
// it to the floor of double arithmetic. Every form, window and route is checked by rebuilding W
// from basis(), coeff() and indices() alone.
#include "support.hpp"

using bd::Basis;
using bd::Side;
using bd_test::nmse;
using bd_test::random_product;
using bd_test::rebuild;

namespace {

// Double has u = 2^-53; an exact identity rebuilt in double leaves rounding errors of a few u
// per entry, amplified by ‖C‖ of a random basis (at most ~10² for these shapes): NMSE ≲ 1e-26.
// The bound 1e-24 leaves room for the worst conditioned window of these seeds.
constexpr double kExactNmse = 1e-24;

struct Shape {
  Eigen::Index m, n, r;
};
const Shape kShapes[] = {{8, 6, 1}, {16, 16, 4}, {33, 17, 5}, {64, 64, 8}, {40, 96, 12}, {97, 31, 30}, {128, 72, 16}};

}  // namespace

TEST_CASE("row-first identity: W = [I; C]·B with B the first r rows", "[identity]") {
  for (const auto& s : kShapes) {
    for (unsigned seed = 1; seed <= 3; ++seed) {
      const auto p = random_product(s.m, s.n, s.r, seed);
      const auto d = bd::decompose_product(p.U, p.V, bd::Options{}.with_basis(Basis::First));
      REQUIRE(d.offset() == 0);
      REQUIRE(d.basis().rows() == s.r);
      REQUIRE(d.basis().cols() == s.n);
      REQUIRE(d.coeff().rows() == s.m - s.r);
      REQUIRE(d.coeff().cols() == s.r);
      const Eigen::MatrixXd W = p.W();
      Eigen::MatrixXd stacked(s.m, s.n);
      stacked << d.basis(), d.coeff() * d.basis();  // [I; C]·B
      CHECK(nmse(stacked, W) < kExactNmse);
    }
  }
}

TEST_CASE("row-last identity: W = [C; I]·B with B the last r rows", "[identity]") {
  for (const auto& s : kShapes) {
    for (unsigned seed = 1; seed <= 3; ++seed) {
      const auto p = random_product(s.m, s.n, s.r, seed);
      const auto d = bd::decompose_product(p.U, p.V, bd::Options{}.with_basis(Basis::Last));
      REQUIRE(d.offset() == s.m - s.r);
      Eigen::MatrixXd stacked(s.m, s.n);
      stacked << d.coeff() * d.basis(), d.basis();  // [C; I]·B
      CHECK(nmse(stacked, p.W()) < kExactNmse);
    }
  }
}

TEST_CASE("col-first identity: W = B·[I, C] with B the first r columns", "[identity]") {
  for (const auto& s : kShapes) {
    for (unsigned seed = 1; seed <= 3; ++seed) {
      const auto p = random_product(s.m, s.n, s.r, seed);
      const auto d = bd::decompose_product(p.U, p.V, bd::Options{}.with_side(Side::Col).with_basis(Basis::First));
      REQUIRE(d.basis().rows() == s.m);
      REQUIRE(d.basis().cols() == s.r);
      REQUIRE(d.coeff().rows() == s.r);
      REQUIRE(d.coeff().cols() == s.n - s.r);
      Eigen::MatrixXd joined(s.m, s.n);
      joined << d.basis(), d.basis() * d.coeff();  // B·[I, C]
      CHECK(nmse(joined, p.W()) < kExactNmse);
    }
  }
}

TEST_CASE("col-last identity: W = B·[C, I] with B the last r columns", "[identity]") {
  for (const auto& s : kShapes) {
    for (unsigned seed = 1; seed <= 3; ++seed) {
      const auto p = random_product(s.m, s.n, s.r, seed);
      const auto d = bd::decompose_product(p.U, p.V, bd::Options{}.with_side(Side::Col).with_basis(Basis::Last));
      REQUIRE(d.offset() == s.n - s.r);
      Eigen::MatrixXd joined(s.m, s.n);
      joined << d.basis() * d.coeff(), d.basis();  // B·[C, I]
      CHECK(nmse(joined, p.W()) < kExactNmse);
    }
  }
}

TEST_CASE("every window offset is an exact basis, in both forms", "[identity]") {
  const auto p = random_product(40, 36, 6, 11);
  const Eigen::MatrixXd W = p.W();
  for (Side side : {Side::Row, Side::Col}) {
    const Eigen::Index along = side == Side::Row ? 40 : 36;
    for (Eigen::Index o = 0; o + 6 <= along; ++o) {
      const auto d = bd::decompose_product(p.U, p.V, bd::Options{}.with_side(side).with_window(o));
      REQUIRE(d.offset() == o);
      REQUIRE(d.contiguous());
      REQUIRE(d.report().chosen == Basis::Window);
      CHECK(nmse(rebuild(d), W) < kExactNmse);
    }
  }
}

TEST_CASE("pivoted bases are exact with any index set, rebuilt through indices()", "[identity]") {
  for (const auto& s : kShapes) {
    for (Side side : {Side::Row, Side::Col}) {
      const auto p = random_product(s.m, s.n, s.r, 5);
      const auto d = bd::decompose_product(p.U, p.V, bd::Options{}.with_side(side).with_basis(Basis::Pivoted));
      REQUIRE(d.report().chosen == Basis::Pivoted);
      REQUIRE(std::is_sorted(d.indices().begin(), d.indices().end()));
      CHECK(nmse(rebuild(d), p.W()) < kExactNmse);
      CHECK(nmse(d.reconstruct(), p.W()) < kExactNmse);
    }
  }
}

TEST_CASE("decompose_product (from the factors) equals decompose (from W)", "[identity]") {
  for (const auto& s : kShapes) {
    for (Side side : {Side::Row, Side::Col}) {
      for (Basis b : {Basis::First, Basis::Last, Basis::ResidualMin, Basis::OffsetSearch, Basis::Pivoted}) {
        const auto p = random_product(s.m, s.n, s.r, 3);
        const bd::Options opts = bd::Options{}.with_side(side).with_basis(b).with_align(4);
        const auto from_factors = bd::decompose_product(p.U, p.V, opts);
        const auto from_w = bd::decompose(p.W(), s.r, opts);
        INFO("shape " << s.m << "x" << s.n << " r=" << s.r << " basis " << bd::to_string(b));
        CHECK(from_factors.indices() == from_w.indices());
        // Same basis rows up to the rounding of forming U·Vᵀ, same coefficients up to its conditioning.
        CHECK(nmse(from_factors.basis(), from_w.basis()) < 1e-28);
        CHECK(nmse(from_factors.coeff(), from_w.coeff()) < 1e-20);
        CHECK(nmse(rebuild(from_w), p.W()) < kExactNmse);
      }
    }
  }
}

TEST_CASE("indices, rest, offset and parameter count describe the stored form", "[identity]") {
  const auto p = random_product(30, 20, 5, 2);
  const auto d = bd::decompose_product(p.U, p.V, bd::Options{}.with_window(7));
  CHECK(d.indices() == std::vector<Eigen::Index>{7, 8, 9, 10, 11});
  const auto rest = d.rest();
  REQUIRE(rest.size() == 25);
  CHECK(rest.front() == 0);
  CHECK(rest[7] == 12);
  CHECK(rest.back() == 29);
  CHECK(d.rank() == 5);
  CHECK(d.rows() == 30);
  CHECK(d.cols() == 20);
  // r(m + n − r) numbers against m·n dense and r(m + n) as factors.
  CHECK(d.parameters() == 5 * (30 + 20 - 5));
  CHECK(d.parameters() < 5 * (30 + 20));
}

TEST_CASE("reconstruct() returns the stored type and agrees with the identities", "[identity]") {
  const auto p = random_product(24, 20, 4, 9);
  const auto d = bd::decompose_product<float>(p.U, p.V, bd::Options{}.with_basis(Basis::Pivoted));
  const Eigen::MatrixXf w = d.reconstruct();
  // Accumulated in float: at most one float rounding per entry beyond the identity itself.
  CHECK(nmse(w, rebuild(d)) < 1e-12);
  CHECK(nmse(d.reconstruct<double>(), rebuild(d)) < 1e-28);
}

TEST_CASE("a dense W beyond rank r reports its truncation apart from the BD error", "[identity]") {
  auto p = random_product(32, 24, 6, 4);
  Eigen::MatrixXd W = p.W();
  W += 1e-3 * bd_test::gaussian(32, 24, 99);  // full rank now
  const auto d = bd::decompose(W, 6, bd::Options{}.with_basis(Basis::Pivoted));
  CHECK(d.report().truncation_nmse > 1e-9);
  CHECK(d.report().nmse >= d.report().truncation_nmse);
  CHECK(d.report().nmse == Approx(nmse(rebuild(d), W)).epsilon(1e-9));
}

TEST_CASE("apply(x) is x·W without W: every basis, both forms, one row and blocks of rows", "[identity]") {
  // Held to x·reconstruct() in double: the stored B and C exactly, multiplied in double. apply
  // sums in x's type through the intermediate the form has — h = x[:, S] + x[:, R]·C (row form),
  // x·B (column form) — so each output errs by at most depth·u times the magnitudes it was summed
  // from: (|x[:, S]| + |x[:, R]|·|C|)·|B| in the row form, |x|·|B| and |x|·|B|·|C| in the column
  // form (γ_n ≤ n·u; Higham, Accuracy and Stability, §3.5), with x rounded to x's type first.
  const auto check_apply = [](const auto& d, const Eigen::MatrixXd& x, double u) {
    const Eigen::MatrixXd W = d.template reconstruct<double>();
    const Eigen::MatrixXd B = d.basis().template cast<double>().cwiseAbs(), C = d.coeff().template cast<double>().cwiseAbs();
    const Eigen::MatrixXd X = x.cwiseAbs();
    Eigen::MatrixXd scale(x.rows(), d.cols());
    if (d.side() == Side::Row) {
      scale = (X(Eigen::all, d.indices()) + X(Eigen::all, d.rest()) * C) * B;
    } else {
      scale(Eigen::all, d.indices()) = X * B;
      scale(Eigen::all, d.rest()) = X * B * C;
    }
    const double depth = double(d.rows() + d.rank() + 2);
    const Eigen::MatrixXd exact = x * W;
    if (u < 1e-10) {
      const Eigen::MatrixXd got = d.apply(x);
      CHECK(((got - exact).cwiseAbs() - depth * u * scale).maxCoeff<Eigen::PropagateNaN>() <= 0);
    } else {
      const Eigen::MatrixXf got = d.apply(x.cast<float>());
      CHECK(((got.cast<double>() - exact).cwiseAbs() - depth * u * scale).maxCoeff<Eigen::PropagateNaN>() <= 0);
    }
  };
  const auto p = random_product(48, 36, 6, 17);
  for (const Side side : {Side::Row, Side::Col}) {
    for (const Basis basis : {Basis::First, Basis::Last, Basis::OffsetSearch, Basis::Pivoted, Basis::Auto}) {
      const bd::Options opts = bd::Options{}.with_basis(basis).with_side(side);
      const auto d64 = bd::decompose_product<double>(p.U, p.V, opts);
      const auto d16 = bd::decompose_product<Eigen::half>(p.U, p.V, opts);
      INFO(bd::to_string(side) << " form, " << bd::to_string(basis) << " basis (" << d64.report().reason << ")");
      for (const Eigen::Index L : {1, 3, 40}) {
        const Eigen::MatrixXd x = bd_test::gaussian(L, d64.rows(), unsigned(L) + 5);
        check_apply(d64, x, std::ldexp(1.0, -53));
        check_apply(d16, x, std::ldexp(1.0, -24));
      }
    }
  }
  // A pivoted basis is not a window: taking x's channels [offset, offset + r) instead of
  // indices() — the hand-rolled product the quickstart once showed — is wrong, apply is not.
  const auto pivoted = bd::decompose_product<double>(p.U, p.V, bd::Options{}.with_basis(Basis::Pivoted));
  REQUIRE_FALSE(pivoted.contiguous());
  const Eigen::MatrixXd x = bd_test::gaussian(2, 48, 3);
  CHECK(bd_test::nmse(pivoted.apply(x), x * p.W()) < 1e-24);
  BD_CHECK_THROWS_CONTAINING(pivoted.apply(Eigen::MatrixXd::Ones(2, 47)), bd::ShapeError,
                             Catch::Contains("x has 47 columns, expected rows() = 48"));
}
