// Basis strategies choose what they promise: Residual-min the better of first/last, offset
// search the best aligned window, one shared window for all heads, Pivoted the rows QR with
// column pivoting picks, Auto within its budget.
#include <algorithm>
#include <limits>

#include "support.hpp"

using bd::Basis;
using bd::Side;
using bd_test::nmse;
using bd_test::random_product;
using bd_test::rebuild;

namespace {

// A product whose first rows are nearly dependent: its first window is ill-conditioned, so
// strategies that can avoid it must. Rows 1..r−1 copy row 0 plus a little noise.
bd_test::Product with_bad_first_window(Eigen::Index m, Eigen::Index n, Eigen::Index r, unsigned seed, double noise) {
  auto p = random_product(m, n, r, seed);
  for (Eigen::Index i = 1; i < r; ++i) p.U.row(i) = p.U.row(0) + noise * bd_test::gaussian(1, r, seed + 100 + i);
  return p;
}

template <typename Scalar>
double exact_nmse(const bd_test::Product& p, const bd::Options& opts) {
  return bd::decompose_product<Scalar>(p.U, p.V, opts).report().nmse;
}

}  // namespace

TEST_CASE("residual-min keeps the better of the first and last windows", "[strategy]") {
  for (unsigned seed = 1; seed <= 8; ++seed) {
    const auto p = seed % 2 ? with_bad_first_window(48, 40, 6, seed, 1e-3) : random_product(48, 40, 6, seed);
    const double first = exact_nmse<Eigen::half>(p, bd::Options{}.with_basis(Basis::First));
    const double last = exact_nmse<Eigen::half>(p, bd::Options{}.with_basis(Basis::Last));
    const auto d = bd::decompose_product<Eigen::half>(p.U, p.V, bd::Options{}.with_basis(Basis::ResidualMin));
    INFO("seed " << seed << ": first " << first << ", last " << last);
    CHECK((d.offset() == 0 || d.offset() == 48 - 6));
    // Ranked by the rounding model, not the exact figure: it must not pick a window clearly worse.
    CHECK(d.report().nmse <= 1.5 * std::min(first, last));
    if (seed % 2) CHECK(d.offset() == 42);  // the ill-conditioned first window is avoided
  }
}

TEST_CASE("offset search tries every aligned window and the last, and finds a near-best one", "[strategy]") {
  const Eigen::Index m = 64, r = 8;
  for (unsigned seed = 1; seed <= 6; ++seed) {
    const auto p = random_product(m, 50, r, seed);
    const bd::Options opts = bd::Options{}.with_basis(Basis::OffsetSearch).with_align(8);
    const auto d = bd::decompose_product<Eigen::half>(p.U, p.V, opts);
    CHECK(d.report().windows_tried == (m - r) / 8 + 1);
    CHECK(d.offset() % 8 == 0);
    double best = INFINITY;
    for (Eigen::Index o = 0; o + r <= m; o += 8)
      best = std::min(best, exact_nmse<Eigen::half>(p, bd::Options{}.with_window(o)));
    INFO("seed " << seed << ": chosen " << d.report().nmse << ", best window " << best);
    CHECK(d.report().nmse <= 1.5 * best);
  }
  // A non-multiple tail still gets the last window: m = 30, r = 7, align 8 → 0, 8, 16, 23.
  const auto p = random_product(30, 20, 7, 3);
  CHECK(bd::decompose_product(p.U, p.V, bd::Options{}.with_basis(Basis::OffsetSearch).with_align(8)).report().windows_tried == 4);
}

TEST_CASE("one window is shared by every head, chosen by mean error", "[strategy][shared]") {
  std::vector<Eigen::MatrixXd> Us, Vs;
  for (unsigned h = 0; h < 6; ++h) {
    const auto p = h == 2 ? with_bad_first_window(48, 32, 8, h + 1, 1e-4) : random_product(48, 32, 8, h + 1);
    Us.push_back(p.U);
    Vs.push_back(p.V);
  }
  for (Side side : {Side::Row, Side::Col}) {
    const auto shared = bd::decompose_shared<float>(Us, Vs, bd::Options{}.with_side(side).with_basis(Basis::OffsetSearch).with_align(8));
    REQUIRE(shared.size() == 6);
    CHECK(shared.shared());
    for (const auto& head : shared.heads()) CHECK(head.indices() == shared.head(0).indices());
    double mean = 0;
    for (std::size_t h = 0; h < 6; ++h) {
      const Eigen::MatrixXd W = Us[h] * Vs[h].transpose();
      mean += nmse(rebuild(shared.head(h)), W) / 6;
    }
    CHECK(shared.mean_nmse() == Approx(mean).epsilon(1e-6));
    if (side == Side::Row) CHECK(shared.offset() != 0);  // head 2's first window is nearly singular
  }
}

TEST_CASE("pivoted bases are per head and not shared", "[strategy][shared]") {
  std::vector<Eigen::MatrixXd> Us, Vs;
  for (unsigned h = 0; h < 4; ++h) {
    const auto p = random_product(40, 30, 6, 20 + h);
    Us.push_back(p.U);
    Vs.push_back(p.V);
  }
  const auto set = bd::decompose_shared<float>(Us, Vs, bd::Options{}.with_basis(Basis::Pivoted));
  CHECK_FALSE(set.shared());
  CHECK(set.chosen() == Basis::Pivoted);
  bool differ = false;
  for (const auto& head : set.heads()) differ |= head.indices() != set.head(0).indices();
  CHECK(differ);
  // Per-head pivoting is at least as accurate as the best shared window, on average.
  const auto window = bd::decompose_shared<float>(Us, Vs, bd::Options{}.with_basis(Basis::OffsetSearch).with_align(2));
  CHECK(set.mean_nmse() <= window.mean_nmse());
}

TEST_CASE("pivoted bases are the rows Businger-Golub pivoting picks on the dense W, well- or ill-conditioned",
          "[strategy]") {
  // QR with column pivoting of Wᵀ (Eigen's, in double, on the product formed densely) picks
  // rows of W by their norms and inner products alone, which the factors' F·Fᵀ = W·Wᵀ share.
  // Graded factors (column scales 1 … grade⁵): at grade 0.01, |R_rr|/|R_11| ≈ 1e-10 is below
  // float's rounding, whose pivoting must hand over to double.
  for (const double grade : {1.0, 0.1, 0.01}) {
    for (unsigned seed = 1; seed <= 4; ++seed) {
      auto p = random_product(40, 30, 6, seed);
      for (Eigen::Index k = 0; k < 6; ++k) p.U.col(k) *= std::pow(grade, double(k));
      const std::vector<Eigen::Index> pivots = bd_test::reference::column_pivots(p.W().transpose());
      std::vector<Eigen::Index> want(pivots.begin(), pivots.begin() + 6);
      std::sort(want.begin(), want.end());
      const auto d = bd::decompose_product<float>(p.U, p.V, bd::Options{}.with_basis(Basis::Pivoted));
      INFO("grade " << grade << ", seed " << seed);
      CHECK(d.indices() == want);
    }
  }
}

TEST_CASE("pivoting hands over to double where float cannot tell the rows apart", "[strategy]") {
  // W's rows 0..4 are orthonormal; row 5 leaves their span by 1e-10, row 6 by 1e-9: the sixth
  // basis row must be row 6 (its coefficients stay 10x smaller). Float's rounding (6e-8) hides
  // both departures: pivoting in float picks between them by its rounding errors.
  Eigen::MatrixXd U = Eigen::MatrixXd::Zero(8, 6);
  for (Eigen::Index i = 0; i < 5; ++i) U(i, i) = 1;
  U(5, 1) = 1, U(5, 5) = 1e-10;
  U(6, 0) = 1, U(6, 5) = 1e-9;
  U(7, 2) = U(7, 3) = 0.5;
  // Turned by a random rotation (which keeps W's row geometry), so that no arithmetic is exact.
  U = U * bd_test::reference::orthonormal_columns(bd_test::gaussian(6, 6, 8u));
  const Eigen::MatrixXd V = bd_test::reference::orthonormal_columns(bd_test::gaussian(10, 6, 9u));  // VᵀV = I: F = U
  const auto d = bd::decompose_product<double>(U, V, bd::Options{}.with_basis(Basis::Pivoted));
  CHECK(d.indices() == std::vector<Eigen::Index>{0, 1, 2, 3, 4, 6});
}

TEST_CASE("a rank-deficient V pivots in W's own geometry too: the rows Businger-Golub pivoting picks on the dense W",
          "[strategy]") {
  // VᵀV singular (V's last column a combination of the others): W = U·Vᵀ has rank r − 1, the
  // geometry comes from a pivoted Cholesky of VᵀV, and the first r − 1 pivots are W's own. The
  // r-th row is then any row (every remaining row of W lies in the span of the first r − 1).
  for (unsigned seed = 1; seed <= 4; ++seed) {
    auto p = random_product(40, 30, 6, seed);
    p.V.col(5) = 0.5 * p.V.col(0) - 2.0 * p.V.col(3);
    const std::vector<Eigen::Index> pivots = bd_test::reference::column_pivots(p.W().transpose());
    const auto d = bd::decompose_product<double>(p.U, p.V, bd::Options{}.with_basis(Basis::Pivoted));
    INFO("seed " << seed);
    for (Eigen::Index k = 0; k < 5; ++k)
      CHECK(std::count(d.indices().begin(), d.indices().end(), pivots[std::size_t(k)]) == 1);
    CHECK(d.report().nmse <= 1e-20);
  }
}

TEST_CASE("auto takes the shared window when it meets the budget and says why", "[strategy][auto]") {
  const auto p = random_product(64, 48, 8, 5);
  const auto d = bd::decompose_product<Eigen::half>(p.U, p.V, bd::Options{}.with_basis(Basis::Auto).with_error_budget(1e6));
  CHECK(d.contiguous());
  CHECK(d.report().requested == Basis::Auto);
  CHECK(d.report().chosen != Basis::Pivoted);
  CHECK(d.report().nmse <= 1e6 * d.report().floor_nmse);
  CHECK_THAT(d.report().reason, Catch::Contains("within the budget"));
}

TEST_CASE("auto falls back to pivoting when no window meets the budget", "[strategy][auto]") {
  const auto p = random_product(64, 48, 8, 5);
  // A budget of 1.0× the floor: only pivoting comes close to the type's own rounding error.
  const auto d = bd::decompose_product<Eigen::half>(p.U, p.V, bd::Options{}.with_basis(Basis::Auto).with_error_budget(1.0));
  CHECK(d.report().chosen == Basis::Pivoted);
  CHECK_THAT(d.report().reason, Catch::Contains("fell back to the per-product pivoted basis"));
  CHECK_THAT(d.report().reason, Catch::Contains("f16 rounding floor"));
  const double window = exact_nmse<Eigen::half>(p, bd::Options{}.with_basis(Basis::OffsetSearch));
  CHECK(d.report().nmse < window);
}

TEST_CASE("auto's screen: a few products bound every window's mean estimate from below", "[strategy][auto]") {
  // Every product's term of the mean estimate is ≥ 0, so k of H products' exact models divided
  // by H can only understate it; the screen skips ranking on the rest only above the budget.
  const bd::Index heads = 12, m = 48, r = 8;
  const bd::Options opts = bd::Options{}.with_align(4);
  std::vector<bd::ranking::FactoredProduct> ps;
  const auto omega = bd::ranking::sketch_matrix(m, opts);
  for (bd::Index h = 0; h < heads; ++h) {
    auto p = random_product(m, 40, r, 60 + h);
    // Head 0 has no good window (rows in near-copies, 1e-3 apart: every window holds four such
    // pairs), so its term dominates every window's mean and a bound counting it more than once
    // would pass the true mean.
    if (h == 0)
      for (bd::Index i = 1; i < m; i += 2) p.U.row(i) = p.U.row(i - 1) + 1e-3 * bd_test::gaussian(1, r, 90 + unsigned(i));
    ps.push_back(bd::ranking::factor_product(p.U, p.V, Eigen::MatrixXf(), "head " + std::to_string(h), omega));
  }
  double best_mean = std::numeric_limits<double>::infinity();
  for (const bd::Index o : bd::ranking::candidate_offsets(Basis::OffsetSearch, m, r, opts.align)) {
    double mean = 0;
    for (const auto& p : ps) mean += bd::ranking::score_window(p, bd::ranking::contiguous(o, r), true).model / p.norm2;
    best_mean = std::min(best_mean, mean / double(heads));
  }
  bd::Index used = 0;
  // A limit of 0 decides after the first product: the weakest bound.
  const double first = bd::ranking::screened_window_bound(ps, opts, 0.0, used);
  CHECK(used == 1);
  CHECK(first > 0);
  CHECK(first <= best_mean);
  // A limit at the first bound: a second product raises every window's bound (its terms are
  // positive), which decides, and the bound still never passes the best window's mean.
  const double second = bd::ranking::screened_window_bound(ps, opts, first, used);
  CHECK(used == 2);
  CHECK(second > first);
  CHECK(second <= best_mean);
  // Just under the best window's mean: the quarter of the products the screen may take cannot
  // prove it (this set's bound after 3 products stays below 0.999 of it), so it does not decide.
  CHECK(bd::ranking::screened_window_bound(ps, opts, 0.999 * best_mean, used) < 0);
  CHECK(used == heads / 4);
  CHECK(bd::ranking::screened_window_bound(ps, opts, best_mean, used) < 0);  // never proves the best over its own mean
}

TEST_CASE("auto over many products: when the screen rules windows out, the result is the pivoted one", "[strategy][auto]") {
  std::vector<Eigen::MatrixXd> Us, Vs;
  for (unsigned h = 0; h < 8; ++h) {
    const auto p = random_product(64, 48, 8, 70 + h);
    Us.push_back(p.U), Vs.push_back(p.V);
  }
  // A budget of 1e-3x the floor: no window comes near it, and one product's models show it.
  const auto a = bd::decompose_shared<Eigen::half>(Us, Vs, bd::Options{}.with_basis(Basis::Auto).with_error_budget(1e-3));
  const auto p = bd::decompose_shared<Eigen::half>(Us, Vs, bd::Options{}.with_basis(Basis::Pivoted));
  CHECK(a.chosen() == Basis::Pivoted);
  CHECK_THAT(a.reason(), Catch::Contains("a bound from 1 of 8 products") && Catch::Contains("fell back"));
  for (std::size_t h = 0; h < Us.size(); ++h) {
    CHECK(a.head(h).indices() == p.head(h).indices());
    CHECK(a.head(h).basis() == p.head(h).basis());
    CHECK(a.head(h).coeff() == p.head(h).coeff());
  }
}

TEST_CASE("the rounding floor is the NMSE of storing the dense product in the type", "[strategy][auto]") {
  const auto p = random_product(64, 64, 8, 8);
  const Eigen::MatrixXd W = p.W();
  const auto h = bd::decompose_product<Eigen::half>(p.U, p.V);
  const Eigen::MatrixXd rounded = bd::rounded_in_double<Eigen::half>(W);
  // Sampled on 64×64 of the 64×64 entries (with replacement): within 20 % of the full figure.
  CHECK(h.report().floor_nmse == Approx(nmse(rounded, W)).epsilon(0.2));
  const auto d = bd::decompose_product<double>(p.U, p.V);
  const double u = bd::unit_roundoff<double>();
  CHECK(d.report().floor_nmse == Approx(u * u / 3));
}

TEST_CASE("the reported NMSE is the exact error of the stored B and C", "[strategy][report]") {
  // Computed through r×r Gram matrices, never the m×n product; compared here with the explicit
  // one. Every product in double, the figures hold 1e-6 (NMSE) and 1e-12 (‖W‖). With the Grams
  // in float (Options::fp32_products, the default) they keep float's 6 digits, less what the
  // refit's partial cancellation of D̂·Vᵀ against Ĉ·ΔB takes: 1e-4 and 1e-6.
  for (bool fp32 : {false, true}) {
    const double nmse_tol = fp32 ? 1e-4 : 1e-6, norm_tol = fp32 ? 1e-6 : 1e-12;
    for (unsigned seed = 1; seed <= 4; ++seed) {
      const auto p = random_product(50, 70, 9, seed);
      const Eigen::MatrixXd W = p.W();
      for (Side side : {Side::Row, Side::Col}) {
        INFO("fp32 products " << fp32 << ", seed " << seed << ", " << bd::to_string(side));
        const auto opts = bd::Options{}.with_side(side).with_fp32_products(fp32);
        const auto f = bd::decompose_product<float>(p.U, p.V, opts);
        const auto h = bd::decompose_product<Eigen::half>(p.U, p.V, opts);
        const auto b = bd::decompose_product<Eigen::bfloat16>(p.U, p.V, opts);
        CHECK(f.report().nmse == Approx(nmse(rebuild(f), W)).epsilon(nmse_tol));
        CHECK(h.report().nmse == Approx(nmse(rebuild(h), W)).epsilon(nmse_tol));
        CHECK(b.report().nmse == Approx(nmse(rebuild(b), W)).epsilon(nmse_tol));
        CHECK(f.report().norm == Approx(W.norm()).epsilon(norm_tol));
        CHECK(f.report().residual == Approx((rebuild(f) - W).norm()).epsilon(nmse_tol));
      }
    }
  }
}

TEST_CASE("the ranking estimate is within an order of magnitude of the exact error", "[strategy][report]") {
  for (unsigned seed = 1; seed <= 6; ++seed) {
    const auto p = random_product(60, 40, 6, seed);
    for (Basis b : {Basis::First, Basis::OffsetSearch, Basis::Pivoted}) {
      const auto d = bd::decompose_product<Eigen::half>(p.U, p.V, bd::Options{}.with_basis(b));
      const double ratio = d.report().nmse / d.report().estimate;
      INFO("seed " << seed << " " << bd::to_string(b) << ": nmse/estimate = " << ratio);
      CHECK(ratio > 0.1);
      CHECK(ratio < 10);
    }
  }
}

TEST_CASE("refitting the coefficients against the rounded basis lowers the error", "[strategy][refit]") {
  double refit = 0, plain = 0;
  for (unsigned seed = 1; seed <= 20; ++seed) {
    const auto p = random_product(48, 40, 8, seed);
    refit += exact_nmse<Eigen::bfloat16>(p, bd::Options{}.with_basis(Basis::First).with_refit(true));
    plain += exact_nmse<Eigen::bfloat16>(p, bd::Options{}.with_basis(Basis::First).with_refit(false));
  }
  // Least squares against B̂ minimises the error before C is rounded; over 20 products the mean
  // must come out lower (the gain is small and consistent: over 20 products it shows).
  CHECK(refit < plain);
}

TEST_CASE("the default strategy is auto: it never trades accuracy silently", "[strategy][auto]") {
  CHECK(bd::Options{}.basis == Basis::Auto);
  const auto p = random_product(64, 48, 8, 5);
  const auto d = bd::decompose_product<Eigen::half>(p.U, p.V);
  CHECK(d.report().nmse <= 10 * d.report().floor_nmse);
}

TEST_CASE("strategy names round-trip through parse_basis", "[strategy]") {
  for (Basis b : {Basis::First, Basis::Last, Basis::ResidualMin, Basis::OffsetSearch, Basis::Pivoted, Basis::Auto,
                  Basis::Window})
    CHECK(bd::parse_basis(bd::to_string(b)) == b);
  CHECK(bd::parse_side("col") == Side::Col);
}

TEST_CASE("a workspace reused across calls of other shapes, storage types and strategies changes no result",
          "[strategy][workspace]") {
  // Buffers sized by an earlier, larger call must not leak into a later one: every result
  // through one shared workspace is bit-identical to the same call with a fresh workspace.
  struct Call {
    Eigen::Index heads, m, n, r;
    Basis basis;
    Side side;
  };
  const Call calls[] = {{6, 96, 120, 16, Basis::OffsetSearch, Side::Row}, {3, 40, 70, 6, Basis::Pivoted, Side::Col},
                        {6, 96, 120, 16, Basis::Auto, Side::Col},         {2, 30, 24, 8, Basis::First, Side::Row},
                        {5, 64, 200, 12, Basis::Last, Side::Col}};
  const auto run = [&](const Call& c, unsigned seed, bd::Workspace& ws, auto stored) {
    using S = decltype(stored);
    std::vector<Eigen::MatrixXd> Us, Vs;
    for (Eigen::Index h = 0; h < c.heads; ++h) {
      const auto p = random_product(c.m, c.n, c.r, seed + static_cast<unsigned>(h));
      Us.push_back(p.U), Vs.push_back(p.V);
    }
    return bd::decompose_shared<S>(Us, Vs, bd::Options{}.with_basis(c.basis).with_side(c.side), ws);
  };
  const auto same = [](const auto& a, const auto& b) {
    REQUIRE(a.heads().size() == b.heads().size());
    for (std::size_t h = 0; h < a.heads().size(); ++h) {
      const auto &x = a.heads()[h], &y = b.heads()[h];
      CHECK(x.indices() == y.indices());
      CHECK(x.basis() == y.basis());
      CHECK(x.coeff() == y.coeff());
      CHECK(x.report().nmse == y.report().nmse);
    }
    CHECK(a.reason() == b.reason());
  };
  bd::Workspace shared;
  for (int round = 0; round < 2; ++round) {
    unsigned seed = 10;
    for (const Call& c : calls) {
      INFO("round " << round << ", " << c.heads << " products " << c.m << "x" << c.n << " rank " << c.r << ", "
                    << bd::to_string(c.basis));
      bd::Workspace fresh_half, fresh_float;
      same(run(c, seed, shared, Eigen::half()), run(c, seed, fresh_half, Eigen::half()));
      same(run(c, seed, shared, float()), run(c, seed, fresh_float, float()));
      seed += 7;
    }
  }
  CHECK(shared.threads() >= 1);
}

TEST_CASE("the ranking sketch is the same on every platform: SplitMix64's bits, normals with N(0,1)'s moments", "[strategy][random]") {
  // SplitMix64's published outputs for seed 1234567 (Steele, Lea and Flood's generator, as the
  // reference implementation prints them): a wrong constant or shift changes every one.
  bd::Random bits(1234567);
  const std::uint64_t reference[] = {6457827717110365317ULL, 3203168211198807973ULL, 9817491932198370423ULL,
                                     4593380528125082431ULL, 16408922859458223821ULL};
  for (const std::uint64_t expected : reference) CHECK(bits.bits() == expected);

  // Ω from Options::seed: the same matrix for the same seed, another for another seed.
  const bd::Options opts;
  const auto omega = bd::ranking::sketch_matrix(20000, opts);
  CHECK(omega->cols() == opts.sketch_columns);
  CHECK(*omega == *bd::ranking::sketch_matrix(20000, opts));
  bd::Options other = opts;
  other.seed += 1;
  CHECK((*omega - *bd::ranking::sketch_matrix(20000, other)).cwiseAbs().minCoeff() > 0);

  // Its N = 160 000 entries as standard normals: the mean within 5/√N of 0, the variance within
  // 5·√(2/N) of 1 (its standard error), and the fractions below −1, 0 and 1 within 5·√(p(1−p)/N)
  // of Φ's 0.158655, 0.5 and 0.841345. A uniform, a half-normal or Box–Muller's radius alone
  // fails all of them.
  const Eigen::ArrayXd v = omega->reshaped().array();
  const double N = double(v.size());
  CHECK(std::abs(v.mean()) < 5 / std::sqrt(N));
  CHECK(std::abs((v - v.mean()).square().mean() - 1) < 5 * std::sqrt(2 / N));
  for (const auto& [x, phi] : {std::pair{-1.0, 0.158655}, std::pair{0.0, 0.5}, std::pair{1.0, 0.841345}}) {
    const double below = (v < x).cast<double>().mean();
    INFO("P(z < " << x << ") = " << below);
    CHECK(std::abs(below - phi) < 5 * std::sqrt(phi * (1 - phi) / N));
  }

  // below(n): every value in [0, n), each about N/n times.
  bd::Random draw(opts.seed);
  std::vector<int> counts(7, 0);
  for (int i = 0; i < 70000; ++i) {
    const bd::Index k = draw.below(7);
    REQUIRE(k >= 0);
    REQUIRE(k < 7);
    ++counts[std::size_t(k)];
  }
  for (const int c : counts) CHECK(std::abs(c - 10000) < 5 * std::sqrt(10000.0 * 6 / 7));
  BD_CHECK_THROWS_CONTAINING(draw.below(0), bd::RangeError, Catch::Contains("expected n >= 1"));
}
