// The cost model counts what BD saves and refuses what it would make worse.
#include "nn_support.hpp"

using bd::nn::AttentionShape;
using bd::nn::BDAttention;
using bd::nn::BDAttentionOptions;
using bd::nn::CostPolicy;
using bd::nn::Mode;
using Catch::Contains;

namespace {

AttentionShape shape(Eigen::Index n_q, Eigen::Index n_kv, Eigen::Index d, Eigen::Index d_h) {
  AttentionShape s;
  s.config.n_q = n_q;
  s.config.n_kv = n_kv;
  s.config.head_dim = d_h;
  s.d_q = s.d_kv = s.d_out = s.d_model_kv = d;
  return s;
}

}  // namespace

TEST_CASE("DeepSeek-V3 shape: the key projection loses 25 % of its weights and 1.33x of its FLOPs", "[cost]") {
  // n = 128 heads, d = 512 (the latent d_c), d_h = 128.
  const auto cost = bd::nn::attention_cost(shape(128, 128, 512, 128), Mode::QK);
  // Dense: n·d_h outputs, each a length-512 dot product: 2·512 − 1 = 1023 FLOPs.
  CHECK(cost.dense.k_flops == 128.0 * 128 * 1023);
  // BD: the window is added, the rest (384 channels) multiplied: 2·384 = 768 FLOPs per output.
  CHECK(cost.bd.k_flops == 128.0 * 128 * 768);
  CHECK(cost.dense.k_flops / cost.bd.k_flops == Approx(1023.0 / 768.0));  // 1.332, the paper's bound
  // Parameters: Wk (512 × 16384) becomes C (384 × 16384): exactly 25 % fewer on the key side.
  const double wk = 512.0 * 16384, ck = 384.0 * 16384;
  CHECK(cost.dense.parameters - cost.bd.parameters == wk - ck);
  CHECK((wk - ck) / wk == Approx(0.25));
  CHECK(cost.bd.cache_elements == cost.dense.cache_elements);
  CHECK(cost.worthwhile());
  const auto both = bd::nn::attention_cost(shape(128, 128, 512, 128), Mode::QKVO);
  CHECK(both.dense.v_flops / both.bd.v_flops == Approx(1023.0 / 768.0));
}

TEST_CASE("GQA where BD costs more: refused with the figures, or prepared with a warning", "[cost][gqa]") {
  // stories260K's shape: d = 64, 8 query heads on 4 key/value heads, d_h = 8.
  const auto cost = bd::nn::attention_cost(shape(8, 4, 64, 8), Mode::VO);
  CHECK(cost.dense.v_flops == 4.0 * 8 * 127);  // 4 heads × 8 outputs × (2·64 − 1)
  CHECK(cost.bd.v_flops == 8.0 * 8 * 112);     // 8 heads × 8 outputs × 2·(64 − 8)
  CHECK(cost.slower());
  CHECK(cost.dense.cache_elements == 4.0 * 8 * 2);
  CHECK(cost.bd.cache_elements == 4.0 * 8 + 8.0 * 8);
  CHECK(cost.larger_cache());
  CHECK_FALSE(cost.worthwhile());
  // Break-even: slower when n_q/n_kv > (2d − 1)/(2(d − d_h)) = 127/112 ≈ 1.13, so even 2:1 loses.
  CHECK_FALSE(bd::nn::attention_cost(shape(8, 8, 64, 8), Mode::VO).slower());

  bd_test::LayerSpec s;
  s.d_q = s.d_kv = s.d_out = 64;
  s.n_q = 8;
  s.n_kv = 4;
  const auto dense = bd_test::random_attention(s, 1);
  BD_CHECK_THROWS_CONTAINING(BDAttention<float>::prepare(dense, BDAttentionOptions{}.with_mode(Mode::VO)), bd::RefusedError,
                             Contains("refused by the cost model") && Contains("n_q/n_kv = 2") &&
                                 Contains("KV cache") && Contains("slower"));
  const auto warned = BDAttention<float>::prepare(dense, BDAttentionOptions{}.with_mode(Mode::VO).with_cost_policy(CostPolicy::Warn));
  REQUIRE(warned.warnings().size() == 1);
  CHECK_THAT(warned.warnings().front(), Contains("K'/V' need 8 heads instead of 4"));
  const auto allowed = BDAttention<float>::prepare(dense, BDAttentionOptions{}.with_mode(Mode::VO).with_cost_policy(CostPolicy::Allow));
  CHECK(allowed.warnings().empty());
}

TEST_CASE("MHA: BD never costs more and its parameter count matches the stored tensors", "[cost]") {
  bd_test::LayerSpec s;
  s.d_q = s.d_kv = s.d_out = 64;
  const auto dense = bd_test::random_attention(s, 2);
  for (Mode m : {Mode::QK, Mode::VO, Mode::QKVO}) {
    const auto bda = BDAttention<float>::prepare(dense, BDAttentionOptions{}.with_mode(m));
    CHECK(bda.cost().worthwhile());
    CHECK(bda.cost().speedup() > 1.0);
    CHECK(double(bda.parameters()) == bda.cost().bd.parameters);
  }
}
