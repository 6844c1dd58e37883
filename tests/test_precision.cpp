// Prepared in double, rounded once: the stored decomposition errs by no more than the rounding
// of its own entries allows, for every storage type.
#include <cmath>
#include <cstring>
#include <random>

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

namespace {

// One storage ulp at |x| (the spacing of Scalar's values just above |x|; subnormal spacing near 0).
template <typename Scalar>
double ulp_at(double x) {
  const Scalar s = bd::round_to<Scalar>(std::fabs(x));
  const double here = bd::to_double(s);
  // The next representable value after `here`: step the bits.
  std::uint16_t bits;
  std::memcpy(&bits, static_cast<const void*>(&s), sizeof bits);
  ++bits;
  Scalar next;
  std::memcpy(static_cast<void*>(&next), &bits, sizeof bits);
  return bd::to_double(next) - here;
}

// Products shaped like DeepSeek's per-head QK/VO (r = d_h, basis side m, other side n), four heads.
struct Heads {
  std::vector<Eigen::MatrixXd> U, V;
};
Heads float_exact_heads(Eigen::Index m, Eigen::Index n, Eigen::Index r, unsigned seed) {
  Heads h;
  for (unsigned k = 0; k < 4; ++k) {
    // Inputs exactly representable in float, as checkpoint weights are.
    h.U.push_back(bd_test::gaussian(m, r, seed + k).cast<float>().cast<double>() / std::sqrt(double(m)));
    h.V.push_back(bd_test::gaussian(n, r, seed + 100 + k).cast<float>().cast<double>() / std::sqrt(double(n)));
  }
  return h;
}

template <typename Scalar>
void check_fp32_products() {
  // B is formed in blocks of bd::basis_block = 256 entries along the side opposite the
  // basis: n = 600 in row form (two full blocks and a partial one), m = 300 in column form (Bᵀ in
  // blocks of its rows: one full, one partial).
  const Eigen::Index m = 300, n = 600, r = 32;
  static_assert(bd::basis_block == 256, "the shapes above straddle blocks of 256");
  const auto heads = float_exact_heads(m, n, r, 41);
  for (Side side : {Side::Row, Side::Col}) {
    INFO(bd::to_string(side) << " form");
    // The best shared window, prepared in double, then the same window with the fast products.
    const auto exact = bd::decompose_shared<Scalar>(
        heads.U, heads.V, bd::Options{}.with_side(side).with_basis(Basis::OffsetSearch).with_fp32_products(false));
    const auto fast = bd::decompose_shared<Scalar>(heads.U, heads.V,
                                                   bd::Options{}.with_side(side).with_window(exact.offset()));
    // B = U_S·Vᵀ formed in float errs by at most γ_{r+2}·(|U_S|·|V|ᵀ)_ij (r products summed, the
    // factors themselves exact in float), far below half's and bfloat16's rounding; rounding is
    // monotone, so the stored values differ by at most that bound plus one ulp, and almost all are
    // identical. C is refitted against its own B̂ (least squares, in double from the same
    // factors): where B̂ moved by an ulp, C follows, by less than one ulp at C's scale (max |C|).
    const double u32 = std::ldexp(1.0, -24), gamma = (r + 2) * u32 / (1 - (r + 2) * u32);
    std::size_t entries = 0, identical = 0;
    for (std::size_t h = 0; h < heads.U.size(); ++h) {
      const auto& a = fast.head(h);
      const auto& b = exact.head(h);
      REQUIRE(a.indices() == b.indices());
      // Compared as r×(other side) row-form bases: the column form's B = W_{:,S} is the row form
      // of Wᵀ = V·Uᵀ, so its basis factor is V_S and the bound's other factor U.
      const bool row = side == Side::Row;
      const Eigen::MatrixXd Ba = row ? bd::values_as<double>(a.basis()) : bd::values_as<double>(a.basis()).transpose();
      const Eigen::MatrixXd Bb = row ? bd::values_as<double>(b.basis()) : bd::values_as<double>(b.basis()).transpose();
      const Eigen::MatrixXd& basis_side = row ? heads.U[h] : heads.V[h];
      const Eigen::MatrixXd& other_side = row ? heads.V[h] : heads.U[h];
      const Eigen::MatrixXd bound =
          gamma * (basis_side(a.indices(), Eigen::all).cwiseAbs() * other_side.cwiseAbs().transpose());
      REQUIRE(Ba.rows() == r);
      for (Eigen::Index i = 0; i < Ba.rows(); ++i)
        for (Eigen::Index j = 0; j < Ba.cols(); ++j) {
          ++entries;
          identical += Ba(i, j) == Bb(i, j);
          const double allowed = ulp_at<Scalar>(std::max(std::fabs(Ba(i, j)), std::fabs(Bb(i, j)))) + bound(i, j);
          if (!(std::fabs(Ba(i, j) - Bb(i, j)) <= allowed)) FAIL("B(" << i << ", " << j << ") differs beyond the bound");
        }
      const Eigen::MatrixXd Ca = bd::values_as<double>(a.coeff()), Cb = bd::values_as<double>(b.coeff());
      CHECK((Ca - Cb).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() <= ulp_at<Scalar>(Cb.cwiseAbs().maxCoeff()));
      // The accuracy is the same: where B̂ moved by an ulp its rounding error changed sides, which
      // moves the NMSE by a few percent either way (1% of the entries, each up to one ulp).
      CHECK(std::fabs(a.report().nmse - b.report().nmse) <= 0.05 * b.report().nmse);
      // The default did run in float: its figure comes from float Grams, so it is not the double
      // one to double's last digits (both from the same factors and, mostly, the same B̂).
      CHECK(std::fabs(a.report().nmse - b.report().nmse) > 1e-12 * b.report().nmse);
      // And the figure is the stored B and C's exact error, ΔB's products summed block by block
      // (float Grams: 1e-4, as in test_strategies.cpp).
      const Eigen::MatrixXd W = heads.U[h] * heads.V[h].transpose();
      CHECK(a.report().nmse == Approx(nmse(rebuild(a), W)).epsilon(1e-4));
    }
    INFO(identical << " of " << entries << " basis entries bit-identical");
    CHECK(double(identical) >= 0.99 * double(entries));
  }
}

}  // namespace

TEST_CASE("half bases formed in float match the fp64-prepared ones within one ulp (plus the proven bound)",
          "[precision][fp32]") {
  check_fp32_products<Eigen::half>();
}

TEST_CASE("bfloat16 bases formed in float match the fp64-prepared ones within one ulp (plus the proven bound)",
          "[precision][fp32]") {
  check_fp32_products<Eigen::bfloat16>();
}

TEST_CASE("float storage keeps B formed in double: bit-identical bases, C within one ulp", "[precision][fp32]") {
  const auto heads = float_exact_heads(160, 512, 32, 43);
  const auto opts = bd::Options{}.with_side(Side::Col).with_basis(Basis::Last);
  const auto fast = bd::decompose_shared<float>(heads.U, heads.V, opts);
  const auto exact = bd::decompose_shared<float>(heads.U, heads.V, bd::Options(opts).with_fp32_products(false));
  for (std::size_t h = 0; h < heads.U.size(); ++h) {
    CHECK(fast.head(h).basis() == exact.head(h).basis());
    const Eigen::MatrixXf Ca = fast.head(h).coeff(), Cb = exact.head(h).coeff();
    for (Eigen::Index i = 0; i < Ca.size(); ++i) {
      const float hi = std::max(std::fabs(Ca(i)), std::fabs(Cb(i)));
      CHECK(std::fabs(Ca(i) - Cb(i)) <= std::nextafter(hi, INFINITY) - hi);
    }
    CHECK(std::fabs(fast.head(h).report().nmse - exact.head(h).report().nmse) <= 1e-3 * exact.head(h).report().nmse);
    // ... and the Grams did run in float: the figure is not the double one to its last digits.
    CHECK(std::fabs(fast.head(h).report().nmse - exact.head(h).report().nmse) > 1e-12 * exact.head(h).report().nmse);
  }
}
