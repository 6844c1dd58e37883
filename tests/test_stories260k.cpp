// On real trained weights (stories260K, a LLaMA-architecture TinyStories model: d = 64,
// 8 query heads, 4 key/value heads, d_h = 8), the VO product of every query head is decomposed
// per head in row form. Bounds are the issue's, set from a float64 model of the computation;
// docs/benchmarks.md, "Accuracy on real trained weights", lists the measured table.
#include <bd/io/safetensors.hpp>

#include "support.hpp"

using bd::Basis;

namespace {

struct VoProducts {
  std::vector<Eigen::MatrixXd> U;  // Wv columns of the head's key/value group, d×d_h (x·W orientation)
  std::vector<Eigen::MatrixXd> V;  // Wo rows of the head, transposed: d×d_h
};

const VoProducts& vo_products() {
  static const VoProducts products = [] {
    const std::string dir = bd_test::require_model("stories260K");
    const auto st = bd::io::SafeTensors::open(dir + "/model.safetensors");
    VoProducts p;
    const int layers = 5, heads = 8, kv_heads = 4, head_dim = 8;
    for (int l = 0; l < layers; ++l) {
      const std::string prefix = "model.layers." + std::to_string(l) + ".self_attn.";
      // Hugging Face stores [out, in]: v = x·Wvᵀ, y = o·Woᵀ.
      const Eigen::MatrixXd wv = st.matrix<double>(prefix + "v_proj.weight");
      const Eigen::MatrixXd wo = st.matrix<double>(prefix + "o_proj.weight");
      for (int h = 0; h < heads; ++h) {
        const int group = h / (heads / kv_heads);
        p.U.push_back(wv.middleRows(group * head_dim, head_dim).transpose());
        p.V.push_back(wo.middleCols(h * head_dim, head_dim));
      }
    }
    return p;
  }();
  return products;
}

template <typename Scalar>
double mean_vo_nmse(const bd::Options& opts) {
  const auto& p = vo_products();
  double sum = 0;
  for (std::size_t h = 0; h < p.U.size(); ++h) {
    const auto d = bd::decompose_product<Scalar>(p.U[h], p.V[h], opts);
    const double err = bd_test::nmse(bd_test::rebuild(d), p.U[h] * p.V[h].transpose());
    // The reported figure is exact through the factors; in double it sits at the floor of
    // double arithmetic (≈1e-31), where only its order of magnitude is meaningful. With the
    // Grams in float (Options::fp32_products, the default) it keeps float's 6 digits less what
    // the refit's partial cancellation of D̂·Vᵀ against Ĉ·ΔB takes: 1e-4 relative; computed in
    // double it agrees to 1e-6.
    if constexpr (std::is_same_v<Scalar, double>) REQUIRE(d.report().nmse < 1e-24);
    else REQUIRE(d.report().nmse == Approx(err).epsilon(opts.fp32_products ? 1e-4 : 1e-6));
    sum += err;
  }
  return sum / static_cast<double>(p.U.size());
}

/// NMSE of rounding Wv and Wo themselves to Scalar and multiplying: the dense model in that type.
template <typename Scalar>
double mean_dense_floor() {
  const auto& p = vo_products();
  double sum = 0;
  for (std::size_t h = 0; h < p.U.size(); ++h) {
    const Eigen::MatrixXd W = p.U[h] * p.V[h].transpose();
    sum += bd_test::nmse(bd::rounded_in_double<Scalar>(p.U[h]) * bd::rounded_in_double<Scalar>(p.V[h]).transpose(), W);
  }
  return sum / static_cast<double>(p.U.size());
}

const bd::Options kOffsetSearch = bd::Options{}.with_basis(Basis::OffsetSearch).with_align(8);

}  // namespace

TEST_CASE("VO of every head, fp32, offset search: mean NMSE <= 2e-14", "[real-model]") {
  const double err = mean_vo_nmse<float>(kOffsetSearch);
  WARN("stories260K VO fp32 offset-search mean NMSE " << err);
  CHECK(vo_products().U.size() == 40);
  CHECK(err <= 2e-14);
}

TEST_CASE("VO of every head, fp16, offset search: mean NMSE <= 1e-6", "[real-model]") {
  const double err = mean_vo_nmse<Eigen::half>(kOffsetSearch);
  WARN("stories260K VO fp16 offset-search mean NMSE " << err << " (paper's residual-min: 3.5e-6)");
  CHECK(err <= 1e-6);
  // Every product in double instead (fp32_products off): the same accuracy, to the storage's
  // rounding (B's float formation moves a few entries by one ulp).
  const double exact = mean_vo_nmse<Eigen::half>(bd::Options(kOffsetSearch).with_fp32_products(false));
  CHECK(err == Approx(exact).epsilon(0.02));
}

TEST_CASE("VO of every head, bf16, offset search: mean NMSE <= 6e-5", "[real-model]") {
  const double err = mean_vo_nmse<Eigen::bfloat16>(kOffsetSearch);
  WARN("stories260K VO bf16 offset-search mean NMSE " << err);
  CHECK(err <= 6e-5);
}

TEST_CASE("VO of every head, fp16, pivoted: within 3x of the dense weights rounded to fp16", "[real-model]") {
  const double err = mean_vo_nmse<Eigen::half>(bd::Options{}.with_basis(Basis::Pivoted));
  const double floor = mean_dense_floor<Eigen::half>();
  WARN("stories260K VO fp16 pivoted mean NMSE " << err << ", dense-in-fp16 floor " << floor);
  CHECK(err <= 3 * floor);
}

TEST_CASE("VO in fp64 is exact on trained weights", "[real-model]") {
  CHECK(mean_vo_nmse<double>(kOffsetSearch) < 1e-24);
  CHECK(mean_vo_nmse<double>(bd::Options{}.with_basis(Basis::First)) < 1e-24);
}

TEST_CASE("one shared window per layer: offset search beats the paper's residual-min", "[real-model][shared]") {
  const auto& p = vo_products();
  double residual_min = 0, offset_search = 0;
  for (int l = 0; l < 5; ++l) {
    const std::vector<Eigen::MatrixXd> U(p.U.begin() + 8 * l, p.U.begin() + 8 * l + 8);
    const std::vector<Eigen::MatrixXd> V(p.V.begin() + 8 * l, p.V.begin() + 8 * l + 8);
    const auto rm = bd::decompose_shared<Eigen::half>(U, V, bd::Options{}.with_basis(Basis::ResidualMin));
    const auto os = bd::decompose_shared<Eigen::half>(U, V, kOffsetSearch);
    CHECK(os.shared());
    residual_min += rm.mean_nmse() / 5;
    offset_search += os.mean_nmse() / 5;
  }
  WARN("stories260K VO fp16 shared window: residual-min " << residual_min << ", offset-search " << offset_search);
  CHECK(offset_search < residual_min);
  CHECK(offset_search <= 1.2e-6);  // docs/benchmarks.md's accuracy table: 8.91e-7 (2026-11-26)
}

TEST_CASE("auto on trained weights: a shared window when one meets the budget, else the pivoted bases, said so", "[real-model][auto]") {
  const auto& p = vo_products();
  const std::vector<Eigen::MatrixXd> U(p.U.begin(), p.U.begin() + 8), V(p.V.begin(), p.V.begin() + 8);
  // Layer 0's best shared window errs by about 23x the f16 rounding floor: over the default
  // budget (10x), so auto falls back to per-head pivoted bases, which reach about 3x the floor.
  const auto set = bd::decompose_shared<Eigen::half>(U, V, bd::Options{}.with_basis(Basis::Auto).with_align(8));
  double floor = 0;
  for (const auto& head : set.heads()) floor += head.report().floor_nmse / static_cast<double>(set.size());
  INFO(set.reason());
  CHECK(set.chosen() == Basis::Pivoted);
  CHECK_FALSE(set.shared());
  CHECK_THAT(set.reason(), Catch::Contains("over the budget 10x the f16 rounding floor") && Catch::Contains("fell back"));
  CHECK(set.mean_nmse() <= 3 * floor);
  // With a budget of 30x the floor, the same window passes: one shared window, within it.
  const auto wide = bd::decompose_shared<Eigen::half>(
      U, V, bd::Options{}.with_basis(Basis::Auto).with_align(8).with_error_budget(30));
  INFO(wide.reason());
  CHECK(wide.chosen() != Basis::Pivoted);
  CHECK(wide.shared());
  CHECK(wide.mean_nmse() <= 30 * floor);
}
