// Prepared in double, rounded once: the stored decomposition errs by no more than the rounding
// of its own entries allows, for every storage type.
#include <cmath>

#include "support.hpp"

using bd::Basis;
using bd::Side;
using bd_test::nmse;
using bd_test::random_product;
using bd_test::rebuild;

namespace {

template <typename Scalar>
void check_rounding_bound(const char* type) {
  const double u = bd::unit_roundoff<Scalar>();
  for (Basis b : {Basis::First, Basis::Last, Basis::OffsetSearch, Basis::Pivoted}) {
    for (Side side : {Side::Row, Side::Col}) {
      for (unsigned seed = 1; seed <= 3; ++seed) {
        const auto p = random_product(72, 56, 8, seed);
        const auto d = bd::decompose_product<Scalar>(p.U, p.V, bd::Options{}.with_basis(b).with_side(side).with_align(8));
        const double err = nmse(rebuild(d), p.W());
        INFO(type << " " << bd::to_string(b) << " " << bd::to_string(side) << " seed " << seed << ": NMSE " << err
                  << ", bound " << bd_test::rounding_bound(d, u));
        CHECK(err <= bd_test::rounding_bound(d, u));
        // And no worse than 10^3 times the type's own rounding of the dense product (u²/3):
        // a random Gaussian basis is well conditioned, so ‖C‖ stays small.
        CHECK(err <= 1e3 * u * u / 3);
      }
    }
  }
}

}  // namespace

TEST_CASE("double: BD is exact to 1e-24 NMSE", "[precision]") {
  // u = 2^-53 ≈ 1.1e-16, u² ≈ 1.2e-32: six orders of magnitude of margin for ‖C‖ amplification.
  for (unsigned seed = 1; seed <= 5; ++seed) {
    for (Basis b : {Basis::First, Basis::Last, Basis::ResidualMin, Basis::OffsetSearch, Basis::Pivoted, Basis::Auto}) {
      const auto p = random_product(96, 80, 12, seed);
      const auto d = bd::decompose_product<double>(p.U, p.V, bd::Options{}.with_basis(b));
      CHECK(nmse(rebuild(d), p.W()) < 1e-24);
      CHECK(d.report().nmse < 1e-24);
    }
  }
}

TEST_CASE("float: error bounded by the rounding of the stored entries (u = 2^-24)", "[precision]") {
  check_rounding_bound<float>("f32");
}

TEST_CASE("half: error bounded by the rounding of the stored entries (u = 2^-11)", "[precision]") {
  check_rounding_bound<Eigen::half>("f16");
}

TEST_CASE("bfloat16: error bounded by the rounding of the stored entries (u = 2^-8)", "[precision]") {
  check_rounding_bound<Eigen::bfloat16>("bf16");
}

TEST_CASE("float inputs are prepared in double, not in float", "[precision]") {
  // The same product given as float factors: preparing in float would leave errors of order
  // u_float·‖C‖; prepared in double and stored in double, only the input's own values matter.
  const auto p = random_product(64, 48, 8, 12);
  const Eigen::MatrixXf Uf = p.U.cast<float>(), Vf = p.V.cast<float>();
  const auto d = bd::decompose_product<double>(Uf, Vf);
  const Eigen::MatrixXd W = Uf.cast<double>() * Vf.cast<double>().transpose();
  CHECK(nmse(rebuild(d), W) < 1e-24);
}

TEST_CASE("rounding to half and bfloat16 happens once, not through float", "[precision][rounding]") {
  // 1 + 2^-11 is the midpoint between the half neighbours 1 and 1 + 2^-10. A double just above
  // it must round up; rounding first to float lands exactly on the midpoint, which ties to
  // even (1.0): the classic double-rounding error.
  const double above_tie = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  CHECK(static_cast<float>(above_tie) == 1.0f + std::ldexp(1.0f, -11));
  CHECK(bd::to_double(bd::round_to<Eigen::half>(above_tie)) == 1.0 + std::ldexp(1.0, -10));
  const double below_tie = 1.0 + std::ldexp(1.0, -11) - std::ldexp(1.0, -40);
  CHECK(bd::to_double(bd::round_to<Eigen::half>(below_tie)) == 1.0);
  // bfloat16: the midpoint of 1 and 1 + 2^-7 is 1 + 2^-8.
  const double bf_above = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -35);
  CHECK(bd::to_double(bd::round_to<Eigen::bfloat16>(bf_above)) == 1.0 + std::ldexp(1.0, -7));
  const double bf_below = -(1.0 + std::ldexp(1.0, -8) - std::ldexp(1.0, -35));
  CHECK(bd::to_double(bd::round_to<Eigen::bfloat16>(bf_below)) == -1.0);
  // Exact ties still go to even, and exact values stay exact.
  CHECK(bd::to_double(bd::round_to<Eigen::half>(1.0 + std::ldexp(1.0, -11))) == 1.0);
  CHECK(bd::to_double(bd::round_to<Eigen::half>(0.375)) == 0.375);
}

TEST_CASE("rounding once agrees with correct rounding on many random values", "[precision][rounding]") {
  // Reference: the nearest half among the two neighbours that bracket x, found in double.
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  std::uniform_int_distribution<int> exponent(-14, 14);
  for (int i = 0; i < 20000; ++i) {
    const double x = std::ldexp(mantissa(rng), exponent(rng));
    const double h = bd::to_double(bd::round_to<Eigen::half>(x));
    const double ulp = std::ldexp(1.0, std::ilogb(x) - 10);
    const double down = std::floor(x / ulp) * ulp, up = down + ulp;
    const double nearest = (x - down < up - x) ? down : (x - down > up - x) ? up : h;  // ties: checked above
    REQUIRE(h == nearest);
  }
}

TEST_CASE("the stored type is the input's by default", "[precision]") {
  const auto p = random_product(20, 16, 4, 1);
  const Eigen::MatrixXf Uf = p.U.cast<float>(), Vf = p.V.cast<float>();
  const auto d = bd::decompose_product(Uf, Vf);
  STATIC_REQUIRE(std::is_same_v<decltype(d)::Scalar, float>);
  const auto h = bd::decompose<Eigen::half>(p.W(), 4);
  STATIC_REQUIRE(std::is_same_v<decltype(h)::Scalar, Eigen::half>);
  CHECK(h.basis().cols() == 16);
}
