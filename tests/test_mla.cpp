// MLA as DeepSeek serves it: query LoRA, the latent cache, absorbed decoding — dense and BD,
// against the dense reference run over the whole sequence.
#include "nn_support.hpp"

using bd::nn::BDAttention;
using bd::nn::BDAttentionOptions;
using bd::nn::Mode;
using bd_test::max_rel;
using Catch::Contains;

namespace {

/// Small shapes of the two DeepSeek families: V2-Lite (no query LoRA) and V3 (query LoRA).
/// Latent 48 > head 8; decoupled RoPE 4; causal, as decoders are.
bd_test::LayerSpec mla(bool q_lora) {
  bd_test::LayerSpec s;
  s.n_q = s.n_kv = 4;
  s.head_dim = 8;
  s.v_head_dim = 8;
  s.d_q = 40;          // model width
  s.d_model_kv = 40;
  s.d_kv = 32;         // latent
  s.d_out = 40;
  s.rope_dim = 4;
  s.causal = true;
  s.q_lora = q_lora ? 24 : 0;
  return s;
}

/// fp64 operators over ≤ 48-term sums: a few hundred ulps of the output's scale at most.
constexpr double kDoubleBound = 1e-12;

}  // namespace

TEST_CASE("MLA dense: absorbed decoding = prefill over the latent cache = the whole-sequence pass", "[mla]") {
  for (const bool q_lora : {false, true}) {
    const auto layer = bd_test::random_attention(mla(q_lora), 3);
    const Eigen::MatrixXd x = bd_test::gaussian(9, 40, 21);
    const Eigen::MatrixXd y = layer.forward(x);
    bd::nn::LatentCache<double> absorbed, prefilled;
    Eigen::MatrixXd y_abs(9, 40), y_pre(9, 40);
    for (Eigen::Index t = 0; t < 9; ++t) {  // one token at a time
      y_abs.row(t) = layer.decode_absorbed(x.row(t), absorbed);
      y_pre.row(t) = layer.prefill(x.row(t), prefilled);
    }
    CHECK(absorbed.length() == 9);
    CHECK(absorbed.latent_dim() == 32);
    CHECK(absorbed.rope_dim() == 4);
    CHECK(max_rel(y_abs, y) <= kDoubleBound);
    CHECK(max_rel(y_pre, y) <= kDoubleBound);
  }
}

TEST_CASE("MLA BD: prefill by Algorithm 2 and absorbed decoding equal the dense reference", "[mla]") {
  for (const bool q_lora : {false, true})
    for (const auto basis : {bd::Basis::Auto, bd::Basis::Pivoted, bd::Basis::First})
      for (const auto mode : {Mode::QKVO, Mode::QK, Mode::VO}) {
        INFO("q_lora " << q_lora << ", basis " << bd::to_string(basis) << ", mode " << bd::nn::to_string(mode));
        const auto layer = bd_test::random_attention(mla(q_lora), 5);
        const auto bd = BDAttention<double>::prepare(layer, BDAttentionOptions{}.with_mode(mode).with_basis(basis)
                                                                .with_cost_policy(bd::nn::CostPolicy::Allow));
        const Eigen::MatrixXd x = bd_test::gaussian(8, 40, 22);
        const Eigen::MatrixXd y = layer.forward(x);
        CHECK(max_rel(bd.forward(x), y) <= kDoubleBound);
        // Chunked prefill: 3 tokens, then 4 against the cached latent, then absorbed decoding.
        bd::nn::LatentCache<double> cache;
        Eigen::MatrixXd out(8, 40);
        out.topRows(3) = bd.prefill(x.topRows(3), cache);
        out.middleRows(3, 4) = bd.prefill(x.middleRows(3, 4), cache);
        out.row(7) = bd.decode_absorbed(x.row(7), cache);
        CHECK(max_rel(out, y) <= kDoubleBound);
        // Several tokens decoded absorbed at once (speculative decoding's verification step).
        bd::nn::LatentCache<double> cache2;
        Eigen::MatrixXd out2(8, 40);
        out2.topRows(2) = bd.decode_absorbed(x.topRows(2), cache2);
        out2.bottomRows(6) = bd.decode_absorbed(x.bottomRows(6), cache2);
        CHECK(max_rel(out2, y) <= kDoubleBound);
      }
}

TEST_CASE("MLA BD in float: absorbed decoding within the fp32 operator bound", "[mla][precision]") {
  const auto layer = bd_test::random_attention(mla(true), 8).cast<float>();
  const auto bd = BDAttention<float>::prepare(layer, BDAttentionOptions{}.with_cost_policy(bd::nn::CostPolicy::Allow));
  const Eigen::MatrixXf x = bd_test::gaussian(6, 40, 23).cast<float>();
  const Eigen::MatrixXf y = layer.forward(x);
  bd::nn::LatentCache<float> cache;
  Eigen::MatrixXf out(6, 40);
  for (Eigen::Index t = 0; t < 6; ++t) out.row(t) = bd.decode_absorbed(x.row(t), cache);
  CHECK(max_rel(out, y) <= bd_test::kFp32OperatorBound);
}

TEST_CASE("MLA: bad caches and layers are refused with a message", "[mla][bad-input]") {
  const auto layer = bd_test::random_attention(mla(false), 3);
  const Eigen::MatrixXd x = bd_test::gaussian(2, 40, 24);
  SECTION("a cache filled by another layer shape") {
    auto other = mla(false);
    other.d_kv = 24;
    const auto narrow = bd_test::random_attention(other, 4);
    bd::nn::LatentCache<double> cache;
    narrow.decode_absorbed(x, cache);
    BD_CHECK_THROWS_CONTAINING(layer.decode_absorbed(x, cache), bd::ShapeError, Contains("another layer shape"));
  }
  SECTION("RoPE widths that differ") {
    auto other = mla(false);
    other.rope_dim = 6;
    const auto wider = bd_test::random_attention(other, 4);
    bd::nn::LatentCache<double> cache;
    wider.prefill(x, cache);
    BD_CHECK_THROWS_CONTAINING(layer.prefill(x, cache), bd::ShapeError, Contains("RoPE keys of 6"));
  }
  SECTION("a layer without a latent") {
    bd_test::LayerSpec plain;
    const auto mha = bd_test::random_attention(plain, 4);
    bd::nn::LatentCache<double> cache;
    BD_CHECK_THROWS_CONTAINING(mha.decode_absorbed(bd_test::gaussian(1, 48, 1), cache), bd::RefusedError,
                               Contains("needs an MLA layer"));
  }
  SECTION("a query LoRA of the wrong width") {
    auto w = layer.weights();
    w.W_qa = bd_test::gaussian(40, 7, 2);
    BD_CHECK_THROWS_CONTAINING(bd::nn::MultiHeadAttention<double>(layer.config(), w), bd::ShapeError,
                               Contains("W_qa is 40x7, expected 40 columns"));
  }
}
