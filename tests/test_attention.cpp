// BDAttention equals the dense attention it was prepared from, in every configuration the
// paper's algebra covers: MHA, biases, GQA, MQA, cross-attention, MLA with decoupled RoPE,
// RoPE with VO, causal or not, and KV-cache decoding.
#include "nn_support.hpp"

using bd::nn::BDAttention;
using bd::nn::BDAttentionOptions;
using bd::nn::CostPolicy;
using bd::nn::Mode;
using bd::nn::Windows;
using bd_test::kFp32OperatorBound;
using bd_test::LayerSpec;
using bd_test::max_rel;
using Catch::Contains;

namespace {

const Mode kModes[] = {Mode::QK, Mode::VO, Mode::QKVO};

BDAttentionOptions allow(Mode m, bd::Basis basis = bd::Basis::OffsetSearch, Windows windows = Windows::PerGroup) {
  return BDAttentionOptions{}.with_mode(m).with_basis(basis).with_cost_policy(CostPolicy::Allow).with_windows(windows);
}

/// BD in fp32 against the dense layer in fp32, for every mode; returns the worst relative error.
double check_equal(const LayerSpec& spec, unsigned seed, Eigen::Index L = 12, Eigen::Index L_kv = 0,
                   bd::Basis basis = bd::Basis::OffsetSearch, Windows windows = Windows::PerGroup) {
  const auto dense64 = bd_test::random_attention(spec, seed);
  const auto dense = dense64.cast<float>();
  const Eigen::MatrixXf x = bd_test::gaussian(L, dense.input_dim(), seed + 1).cast<float>();
  const Eigen::MatrixXf x_kv =
      L_kv ? Eigen::MatrixXf(bd_test::gaussian(L_kv, dense.kv_input_dim(), seed + 2).cast<float>()) : x;
  const Eigen::MatrixXf y = dense.forward(x, x_kv);
  double worst = 0;
  for (Mode m : kModes) {
    const auto bda = BDAttention<float>::prepare(dense64, allow(m, basis, windows));
    const double err = max_rel(bda.forward(x, x_kv), y);
    INFO("mode " << bd::nn::to_string(m) << ", " << bd::nn::to_string(windows) << " windows: max |BD − dense| / max |dense| = " << err);
    CHECK(err <= kFp32OperatorBound);
    worst = std::max(worst, err);
  }
  return worst;
}

}  // namespace

TEST_CASE("plain MHA: BD equals dense for qk, vo and qkvo", "[attention]") {
  for (unsigned seed = 1; seed <= 3; ++seed) check_equal(LayerSpec{}, seed);
}

TEST_CASE("causal MHA: BD equals dense", "[attention]") {
  LayerSpec s;
  s.causal = true;
  check_equal(s, 4);
}

TEST_CASE("biases: query bias becomes a Q' bias, key bias drops out, value bias folds into the output bias",
          "[attention][bias]") {
  LayerSpec s;
  s.biases = true;
  s.causal = true;
  for (unsigned seed = 1; seed <= 3; ++seed) check_equal(s, seed);
  // The folded output bias is bo + Σ_h bv_g·Wo_h, and B_vo carries no bias of its own.
  const auto dense = bd_test::random_attention(s, 7);
  const auto bda = BDAttention<double>::prepare(dense, allow(Mode::VO));
  const Eigen::MatrixXd zero = Eigen::MatrixXd::Zero(3, dense.input_dim());
  CHECK(max_rel(bda.forward(zero), dense.forward(zero)) < 1e-12);
}

TEST_CASE("GQA 2:1, 4:1 and 8:1: K'/V' per key/value group and per query head equal dense", "[attention][gqa]") {
  for (const Windows w : {Windows::PerGroup, Windows::PerHead})
    for (const bd::Basis b : {bd::Basis::OffsetSearch, bd::Basis::Pivoted}) {
      LayerSpec s;
      s.n_q = 8;
      s.n_kv = 4;
      check_equal(s, 1, 12, 0, b, w);  // 2:1
      s.n_kv = 2;
      s.biases = true;
      check_equal(s, 5, 12, 0, b, w);  // 4:1, biases
      s.n_kv = 1;
      s.biases = false;
      s.causal = true;
      check_equal(s, 2, 12, 0, b, w);  // 8:1
    }
}

TEST_CASE("MQA: one key/value head for all query heads", "[attention][gqa]") {
  LayerSpec s;
  s.n_q = 6;
  s.n_kv = 1;
  s.biases = true;
  for (const Windows w : {Windows::PerGroup, Windows::PerHead}) check_equal(s, 3, 12, 0, bd::Basis::OffsetSearch, w);
}

TEST_CASE("GQA per group: one window and one C serve every query head of a group, and the cache is the dense cache",
          "[attention][gqa]") {
  // With the window S fixed, C = Wv_g[R]·Wv_g[S]⁻¹ does not depend on Wo_h: the per-query-head
  // coefficients of a group's heads (the first-rows window for all) equal the group's.
  LayerSpec s;
  s.n_q = 8;
  s.n_kv = 2;
  s.biases = true;
  const auto dense = bd_test::random_attention(s, 21);
  const auto group = BDAttention<double>::prepare(dense, allow(Mode::QKVO, bd::Basis::First, Windows::PerGroup));
  const auto head = BDAttention<double>::prepare(dense, allow(Mode::QKVO, bd::Basis::First, Windows::PerHead));
  const Eigen::Index dh = s.head_dim, G = s.n_q / s.n_kv;
  CHECK(group.windows() == Windows::PerGroup);
  CHECK(group.vo_indices().heads() == s.n_kv);
  CHECK(group.qk_indices().heads() == s.n_kv);
  CHECK(group.vo_coeff().cols() == s.n_kv * dh);
  CHECK(group.qk_coeff().cols() == s.n_kv * dh);
  CHECK(head.vo_coeff().cols() == s.n_q * dh);
  for (Eigen::Index h = 0; h < s.n_q; ++h) {
    const Eigen::Index g = h / G;
    CHECK(max_rel(head.vo_coeff().middleCols(h * dh, dh), group.vo_coeff().middleCols(g * dh, dh)) < 1e-12);
    CHECK(max_rel(head.qk_coeff().middleCols(h * dh, dh), group.qk_coeff().middleCols(g * dh, dh)) < 1e-12);
    // Each query head keeps its own basis, the same in both forms.
    CHECK(max_rel(head.vo_basis().middleRows(h * dh, dh), group.vo_basis().middleRows(h * dh, dh)) < 1e-12);
    CHECK(max_rel(head.qk_basis().middleCols(h * dh, dh), group.qk_basis().middleCols(h * dh, dh)) < 1e-12);
  }
  // The cost model: no more cache than dense, fewer FLOPs; per query head, 4× the heads of K'/V'.
  CHECK(group.cost().bd.cache_elements == group.cost().dense.cache_elements);
  CHECK(group.cost().worthwhile());
  CHECK(head.cost().bd.cache_elements == 2.0 * s.n_q * dh);
  // Decoding caches K'/V' of n_kv heads, as the dense layer caches K/V.
  const Eigen::MatrixXd x = bd_test::gaussian(9, dense.input_dim(), 22);
  bd::nn::KVCache<double> cache, dense_cache;
  const Eigen::MatrixXd y = group.decode(x, cache);
  dense.decode(x, dense_cache);
  CHECK(cache.keys().cols() == dense_cache.keys().cols());
  CHECK(cache.values().cols() == dense_cache.values().cols());
  CHECK(max_rel(y, dense.forward(x)) < 1e-12);
}

TEST_CASE("cross-attention: query and key/value inputs of different widths and lengths", "[attention][cross]") {
  LayerSpec s;
  s.d_q = 40;
  s.d_kv = 72;
  s.d_out = 56;
  s.biases = true;
  check_equal(s, 5, /*L=*/9, /*L_kv=*/17);
}

TEST_CASE("MLA with decoupled RoPE: BD on the no-RoPE channels and on VO", "[attention][mla]") {
  LayerSpec s;  // DeepSeek-V2 in miniature: latent 32 from a 64-wide model, 4 heads, RoPE 4
  s.d_q = 64;
  s.d_model_kv = 64;
  s.d_kv = 32;
  s.d_out = 64;
  s.head_dim = 8;
  s.v_head_dim = 6;
  s.rope_dim = 4;
  s.causal = true;
  check_equal(s, 6);
}

TEST_CASE("RoPE: VO is exact, QK is refused with a message that names RoPE", "[attention][rope]") {
  LayerSpec s;
  s.rope_theta = 10000;
  s.causal = true;
  const auto dense = bd_test::random_attention(s, 8);
  const Eigen::MatrixXd x = bd_test::gaussian(10, dense.input_dim(), 9);
  const auto vo = BDAttention<double>::prepare(dense, allow(Mode::VO));
  CHECK(max_rel(vo.forward(x), dense.forward(x)) < 1e-12);
  for (Mode m : {Mode::QK, Mode::QKVO})
    BD_CHECK_THROWS_CONTAINING(BDAttention<double>::prepare(dense, allow(m)), bd::RefusedError,
                               Contains("not exact under RoPE") && Contains("use mode vo"));
  // Forced, it runs — and is measurably not exact.
  const auto forced = BDAttention<double>::prepare(dense, allow(Mode::QK).with_force(true));
  CHECK(max_rel(forced.forward(x), dense.forward(x)) > 1e-6);
}

TEST_CASE("per-head pivoted bases give the same outputs", "[attention][pivoted]") {
  LayerSpec s;
  s.n_q = 8;
  s.n_kv = 2;
  s.biases = true;
  s.causal = true;
  check_equal(s, 10, 12, 0, bd::Basis::Pivoted);
  const auto bda = BDAttention<float>::prepare(bd_test::random_attention(s, 10), allow(Mode::QKVO, bd::Basis::Pivoted));
  CHECK_FALSE(bda.qk_indices().shared);
  CHECK_FALSE(bda.vo_report().shared);
}

TEST_CASE("double storage: BD attention is exact to double rounding", "[attention]") {
  LayerSpec s;
  s.biases = true;
  s.causal = true;
  s.n_q = 8;
  s.n_kv = 2;
  const auto dense = bd_test::random_attention(s, 11);
  const Eigen::MatrixXd x = bd_test::gaussian(15, dense.input_dim(), 12);
  for (Mode m : kModes) CHECK(max_rel(BDAttention<double>::prepare(dense, allow(m)).forward(x), dense.forward(x)) < 1e-12);
}

TEST_CASE("KV-cache decoding equals running the whole sequence at once", "[attention][decode]") {
  for (const bool mla : {false, true}) {
    LayerSpec s;
    s.causal = true;
    s.biases = !mla;
    s.n_q = 8;
    s.n_kv = mla ? 8 : 2;
    if (mla) {
      s.d_model_kv = 64;
      s.d_q = 64;
      s.d_kv = 32;
      s.rope_dim = 4;
    }
    const auto dense = bd_test::random_attention(s, 13);
    const Eigen::MatrixXd x = bd_test::gaussian(11, dense.input_dim(), 14);
    const Eigen::MatrixXd full = dense.forward(x);
    for (Mode m : kModes) {
      const Windows windows = m == Mode::QK ? Windows::PerHead : Windows::PerGroup;  // both forms decode
      const auto bda = BDAttention<double>::prepare(dense, allow(m, bd::Basis::OffsetSearch, windows));
      bd::nn::KVCache<double> cache, dense_cache;
      Eigen::MatrixXd stepped(11, full.cols()), dense_stepped(11, full.cols());
      // Several tokens at once, then one at a time, then the rest together.
      const Eigen::Index cuts[] = {0, 4, 5, 6, 7, 11};
      for (int k = 0; k + 1 < 6; ++k) {
        const Eigen::Index a = cuts[k], n = cuts[k + 1] - cuts[k];
        stepped.middleRows(a, n) = bda.decode(x.middleRows(a, n), cache);
        dense_stepped.middleRows(a, n) = dense.decode(x.middleRows(a, n), dense_cache);
      }
      INFO("mla " << mla << ", mode " << bd::nn::to_string(m));
      CHECK(cache.length() == 11);
      CHECK(max_rel(stepped, full) < 1e-12);
      CHECK(max_rel(dense_stepped, full) < 1e-12);
      // K'/V' are cached per key/value group, or per query head when asked.
      CHECK(cache.keys().cols() == (windows == Windows::PerHead ? s.n_q : s.n_kv) * s.head_dim);
      // Rolling back the last three tokens and decoding them again gives the same outputs.
      cache.truncate(8);
      CHECK(max_rel(bda.decode(x.bottomRows(3), cache), full.bottomRows(3)) < 1e-12);
      BD_CHECK_THROWS_CONTAINING(cache.truncate(12), bd::RangeError, Contains("the cache holds 11 tokens"));
    }
  }
}

TEST_CASE("BD attention in half storage errs like the dense layer in half", "[attention][precision]") {
  LayerSpec s;
  s.causal = true;
  s.biases = true;
  const auto dense = bd_test::random_attention(s, 15);
  const Eigen::MatrixXf x = bd_test::gaussian(12, dense.input_dim(), 16).cast<float>();
  const Eigen::MatrixXd exact = dense.forward(x.cast<double>());
  const double dense_half = max_rel(dense.cast<Eigen::half>().forward(x), exact);
  const auto bda = BDAttention<Eigen::half>::prepare(dense, allow(Mode::QKVO, bd::Basis::Pivoted));
  const double bd_half = max_rel(bda.forward(x), exact);
  INFO("dense in f16: " << dense_half << ", BD in f16: " << bd_half);
  // Both are a few units of f16's u = 2^-11 ≈ 4.9e-4 relative to the output scale.
  CHECK(bd_half <= 3 * dense_half);
  CHECK(bd_half < 2e-2);
}

TEST_CASE("bad layers and inputs are refused with what was expected", "[attention][bad-input]") {
  LayerSpec s;
  auto dense = bd_test::random_attention(s, 17);
  BD_CHECK_THROWS_CONTAINING(dense.forward(Eigen::MatrixXd::Ones(3, 5)), bd::ShapeError,
                             Contains("input has 5 columns, expected 48"));
  const auto bda = BDAttention<double>::prepare(dense, allow(Mode::QKVO));
  BD_CHECK_THROWS_CONTAINING(bda.forward(Eigen::MatrixXd::Ones(3, 5)), bd::ShapeError,
                             Contains("input has 5 columns, expected 48"));
  bd::nn::AttentionConfig c = dense.config();
  c.n_kv = 3;
  BD_CHECK_THROWS_CONTAINING(bd::nn::MultiHeadAttention<double>(c, dense.weights()), bd::RangeError,
                             Contains("n_q a multiple of n_kv"));
  auto w = dense.weights();
  w.Wo.conservativeResize(w.Wo.rows() - 1, Eigen::NoChange);
  BD_CHECK_THROWS_CONTAINING(bd::nn::MultiHeadAttention<double>(dense.config(), w), bd::ShapeError,
                             Contains("Wo is 31x48, expected 32 rows"));
  w = dense.weights();
  w.Wv(3, 3) = std::nan("");
  BD_CHECK_THROWS_CONTAINING(bd::nn::MultiHeadAttention<double>(dense.config(), w), bd::NonFiniteError,
                             Contains("holds nan at (3, 3)"));
  BD_CHECK_THROWS_CONTAINING(bd::nn::parse_mode("kv"), bd::RangeError, Contains("expected qk, vo or qkvo"));
}

TEST_CASE("attend reads the values from the keys only when told they are the keys' channels", "[attention][attend]") {
  // Absorbed MLA attends every head to one latent that is both key and value: its caller says so
  // (AttendSpec::values_are_keys) and the kernel may read the values from the keys' runs. The
  // result is the one the values as a separate matrix give, to the bit; a V that is not K is refused.
  bd::nn::AttendSpec s;
  s.n_q = 16, s.n_k = 1, s.d_qk = s.d_v = 24, s.scale = 0.2, s.causal = true;
  const Eigen::MatrixXf Q = bd_test::gaussian(5, 16 * 24, 1).cast<float>(), C = bd_test::gaussian(300, 24, 2).cast<float>();
  const Eigen::MatrixXf copy = C;
  const Eigen::MatrixXf apart = bd::nn::attend<float>(Q, C, copy, s);
  s.values_are_keys = true;
  const Eigen::MatrixXf shared = bd::nn::attend<float>(Q, C, C, s);
  CHECK(shared == apart);
  BD_CHECK_THROWS_CONTAINING(bd::nn::attend<float>(Q, C, copy, s), bd::ShapeError, Contains("values_are_keys"));
}
