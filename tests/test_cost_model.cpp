// The cost model counts what BD saves and refuses what it would make worse.
#include "nn_support.hpp"

using bd::nn::AttentionShape;
using bd::nn::BDAttention;
using bd::nn::BDAttentionOptions;
using bd::nn::CostPolicy;
using bd::nn::Mode;
using bd::nn::Windows;
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

TEST_CASE("GQA: windows per key/value group keep the dense cache and cost less — per query head costs more and is refused",
          "[cost][gqa]") {
  // stories260K's shape: d = 64, 8 query heads on 4 key/value heads, d_h = 8.
  const auto group = bd::nn::attention_cost(shape(8, 4, 64, 8), Mode::VO);
  CHECK(group.windows == Windows::PerGroup);
  CHECK(group.dense.v_flops == 4.0 * 8 * 127);  // 4 heads × 8 outputs × (2·64 − 1)
  CHECK(group.bd.v_flops == 4.0 * 8 * 112);     // 4 heads of V' × 8 outputs × 2·(64 − 8)
  CHECK(group.bd.cache_elements == group.dense.cache_elements);
  CHECK(group.dense.parameters - group.bd.parameters == 4.0 * 8 * 8);  // C is (64 − 8) × 4·8 where Wv was 64 × 4·8
  CHECK(group.worthwhile());
  const auto cost = bd::nn::attention_cost(shape(8, 4, 64, 8), Mode::VO, Windows::PerHead);
  CHECK(cost.dense.v_flops == 4.0 * 8 * 127);
  CHECK(cost.bd.v_flops == 8.0 * 8 * 112);  // 8 heads × 8 outputs × 2·(64 − 8)
  CHECK(cost.slower());
  CHECK(cost.dense.cache_elements == 4.0 * 8 * 2);
  CHECK(cost.bd.cache_elements == 4.0 * 8 + 8.0 * 8);
  CHECK(cost.larger_cache());
  CHECK_FALSE(cost.worthwhile());
  // Break-even per query head: slower when n_q/n_kv > (2d − 1)/(2(d − d_h)) = 127/112 ≈ 1.13.
  CHECK_FALSE(bd::nn::attention_cost(shape(8, 8, 64, 8), Mode::VO, Windows::PerHead).slower());

  bd_test::LayerSpec s;
  s.d_q = s.d_kv = s.d_out = 64;
  s.n_q = 8;
  s.n_kv = 4;
  const auto dense = bd_test::random_attention(s, 1);
  CHECK(BDAttention<float>::prepare(dense, BDAttentionOptions{}.with_mode(Mode::VO)).warnings().empty());
  const auto per_head = BDAttentionOptions{}.with_mode(Mode::VO).with_windows(Windows::PerHead);
  BD_CHECK_THROWS_CONTAINING(BDAttention<float>::prepare(dense, per_head), bd::RefusedError,
                             Contains("refused by the cost model") && Contains("n_q/n_kv = 2") && Contains("KV cache") &&
                                 Contains("slower") && Contains("Windows::PerGroup"));
  const auto warned = BDAttention<float>::prepare(dense, BDAttentionOptions(per_head).with_cost_policy(CostPolicy::Warn));
  REQUIRE(warned.warnings().size() == 1);
  CHECK_THAT(warned.warnings().front(), Contains("K'/V' need 8 heads instead of 4"));
  const auto allowed = BDAttention<float>::prepare(dense, BDAttentionOptions(per_head).with_cost_policy(CostPolicy::Allow));
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

TEST_CASE("MLA served absorbed: DeepSeek-V3's figures by hand, and BD is never refused there", "[cost][mla]") {
  // 128 heads, hidden 7168, query LoRA 1536, latent 512, nope 128, rope 64, v 128.
  AttentionShape s;
  s.config.n_q = s.config.n_kv = 128;
  s.config.head_dim = 128;
  s.config.v_head_dim = 128;
  s.config.rope_dim = 64;
  s.d_q = 1536;
  s.d_model_q = 7168;
  s.d_kv = 512;
  s.d_model_kv = 7168;
  s.d_out = 7168;
  s.latent = true;
  const auto m = bd::nn::mla_cost(s, Mode::QKVO);
  // The same for both: latent and k_rope (576·(2·7168 − 1)), query LoRA (1536·14335),
  // q_nope (128·128·(2·1536 − 1)), q_rope (128·64·3071), o_proj (7168·(2·16384 − 1)).
  const double common = 576.0 * 14335 + 1536.0 * 14335 + 128.0 * 128 * 3071 + 128.0 * 64 * 3071 + 7168.0 * 32767;
  CHECK(common == 340622272.0);
  // Absorbed: Q̃ = q·W_ukᵀ, 512 outputs of length-128 dots per head, 384 with BD; O = Õ·W_uv,
  // 128 outputs of length-512 dots per head, 2·384 FLOPs each with BD.
  CHECK(m.decode_dense == common + 128.0 * 512 * 255 + 128.0 * 128 * 1023);
  CHECK(m.decode_bd == common + 128.0 * 384 * 255 + 128.0 * 128 * 768);
  CHECK(m.decode_dense - m.decode_bd == 8355840.0);  // n·d_h·255 + n·d_v·255: ≈ n·d_h² per product
  // Prefill recomputes K'/V' from the latent: the up-projections lose 1023/768 = 1.33x.
  CHECK(m.prefill_dense == common + 2 * 128.0 * 128 * 1023);
  CHECK(m.prefill_bd == common + 2 * 128.0 * 128 * 768);
  // Parameters: W_uk, W_uv (512 × 16384 each) become C (384 × 16384): 25 % of them.
  CHECK(m.parameters_dense - m.parameters_bd == 2 * 128.0 * 16384);
  CHECK(m.cache_values == 576);
  CHECK(m.worthwhile());
  CHECK_THAT(m.describe(), Contains("latent cache 576 values/token for both"));
  // The attention over the context is the same for both and left out of the figures.
  CHECK(m.context_flops(1024, s) == 128.0 * (1024 * (2 * 576 - 1) + 512.0 * 2047));
  AttentionShape plain = s;
  plain.latent = false;
  BD_CHECK_THROWS_CONTAINING(bd::nn::mla_cost(plain, Mode::QKVO), bd::RangeError, Contains("reads no latent"));
}

TEST_CASE("MLA layers with a query LoRA are prepared, not refused, and cost as counted", "[cost][mla]") {
  bd_test::LayerSpec spec;
  spec.d_q = spec.d_out = spec.d_model_kv = 40;
  spec.d_kv = 32;
  spec.rope_dim = 4;
  spec.q_lora = 24;
  const auto layer = bd_test::random_attention(spec, 2);
  const auto bd = BDAttention<double>::prepare(layer, BDAttentionOptions{});  // CostPolicy::Refuse
  const auto m = bd::nn::mla_cost(AttentionShape::of(layer.config(), layer.weights()), Mode::QKVO);
  CHECK(m.decode_bd < m.decode_dense);
  CHECK(m.prefill_bd < m.prefill_dense);
  CHECK(bd.parameters() > 0);
}

TEST_CASE("the words users type for each enumerator are unchanged", "[names]") {
  CHECK(std::string(to_string(Windows::PerGroup)) == "per-group");
  CHECK(bd::nn::parse_windows("per-head") == Windows::PerHead);
  CHECK(std::string(to_string(bd::nn::PrefillPath::Recompute)) == "recompute");
  CHECK(std::string(bd::to_string(bd::Storage::BF16)) == "bf16");
  CHECK(std::string(bd::kernel::to_string(bd::kernel::Isa::AVX2)) == "avx2");
}
