// Layers computing in bf16 (compute.hpp): every product takes its operands rounded once to
// bfloat16 and sums in f32 (the attention's QKᵀ and P·V too, where they run tiled), the rest
// (softmax, norms, RoPE, BD's basis channels, decoding's few-row attention) in f32. What the paper's bf16 claim needs: BD's error in bf16, over the layer
// computed in double, no worse than the dense layer's own in bf16 — measured on DeepSeek-V3's
// shape (MLA: 128 heads, latent 512, decoupled RoPE 64; a few tokens) here, on stories260K's
// trained weights in test_llama.cpp. Layers that cannot honour bf16 refuse it by name when it is
// asked for.
#include <bd/nn/llama.hpp>

#include "nn_support.hpp"

using bd::kernel::Compute;
using bd::nn::BDAttention;
using bd::nn::BDAttentionOptions;
using bd::nn::MultiHeadAttention;
using bd_test::max_rel;
using Catch::Contains;
using Eigen::Index;
using Eigen::MatrixXd;
using Eigen::MatrixXf;

namespace {

double rel_error(const MatrixXf& got, const MatrixXd& exact) {
  return (got.cast<double>() - exact).norm() / exact.norm();
}

/// The dense layer and its BD form in f32 storage, both in bf16 compute, against the double layer:
/// the errors (relative Frobenius) of each.
template <typename Dense>
std::pair<double, double> bf16_errors(const Dense& layer64, const MatrixXd& x, const BDAttentionOptions& opts) {
  MultiHeadAttention<float> dense = layer64.template cast<float>();
  BDAttention<float> bd = BDAttention<float>::prepare(layer64, opts);
  dense.set_compute(Compute::BF16);
  bd.set_compute(Compute::BF16);
  CHECK_THAT(bd.cost().describe(), Contains("bf16 compute"));
  const MatrixXd exact = layer64.forward(x);
  const MatrixXf xf = x.cast<float>();
  return {rel_error(dense.forward(xf), exact), rel_error(bd.forward(xf), exact)};
}

}  // namespace

TEST_CASE("bf16 compute: BD attention's error at DeepSeek-V3's shape is within 2x the dense layer's own", "[bf16][mla]") {
  // BD computes in another basis of each head (V' = V·W_S⁻¹, B = W_S·Wo for VO): rounding its
  // operands errs by |z_R|·|C| where the dense layer's errs by |z|·|W|, so the ratio is set by
  // the chosen basis's conditioning. Gaussian weights, whose pivoted 128-row bases are worse
  // conditioned than a trained model's, measure 1.7–1.9x (docs/benchmarks.md), where
  // stories260K's trained weights give 1.07x (test_llama.cpp); an offset-search window, 44x.
  // DeepSeek-V3's heads (latent 512, d_h 128, decoupled RoPE 64), 8 of its 128, from a model
  // width of 1024 instead of 7168: each head's products are V3's; the test stays seconds long.
  bd_test::LayerSpec s;
  s.n_q = s.n_kv = 8, s.head_dim = 128, s.v_head_dim = 128, s.rope_dim = 64;
  s.d_q = s.d_model_kv = s.d_out = 1024, s.d_kv = 512;
  s.causal = true;
  const auto layer = bd_test::random_attention(s, 31);
  const MatrixXd x = bd_test::gaussian(6, 1024, 32);
  for (const bd::nn::Mode mode : {bd::nn::Mode::VO, bd::nn::Mode::QKVO}) {
    const auto [dense, bd] = bf16_errors(layer, x, BDAttentionOptions{}.with_mode(mode));
    INFO("mode " << bd::nn::to_string(mode) << ": dense bf16 " << dense << ", BD bf16 " << bd);
    CHECK(dense > 1e-3);  // bf16 compute happened: f32's error is three orders below
    CHECK(bd <= 2.0 * dense);
  }
}

TEST_CASE("bf16 compute: a linear layer computes the product of its rounded operands", "[bf16][linear]") {
  const MatrixXf W = bd_test::gaussian(300, 70, 41).cast<float>(), x = bd_test::gaussian(9, 300, 42).cast<float>();
  const Eigen::VectorXf b = bd_test::gaussian(70, 1, 43).cast<float>();
  bd::nn::DenseLinear<float> layer(W, b);
  CHECK(layer.compute() == Compute::F32);
  layer.set_compute(Compute::BF16);
  const auto rounded = [](const MatrixXf& m) { return m.cast<Eigen::bfloat16>().cast<double>().eval(); };
  const MatrixXd exact = (rounded(x) * rounded(W)).rowwise() + b.cast<double>().transpose();
  const MatrixXd magnitude = (rounded(x).cwiseAbs() * rounded(W).cwiseAbs()).rowwise() + b.cast<double>().cwiseAbs().transpose();
  const MatrixXd excess = (layer.forward(x).cast<double>() - exact).cwiseAbs() - 301 * std::ldexp(1.0, -24) * magnitude;
  CHECK(excess.maxCoeff<Eigen::PropagateNaN>() <= 0);
  // Stored in bf16 the same weights give the same output (the rounding is the storage's).
  bd::nn::DenseLinear<Eigen::bfloat16> stored(W.cast<Eigen::bfloat16>(), b.cast<Eigen::bfloat16>());
  stored.set_compute(Compute::BF16);
  CHECK(max_rel(stored.forward(x), layer.forward(x)) <= std::ldexp(1.0, -8));  // the bias's rounding
}

TEST_CASE("bf16 compute: BDLinear in bf16 stays within 2x the bf16 error of its low-rank twin", "[bf16][linear]") {
  // As for attention, the ratio is the pivoted basis's conditioning on Gaussian factors: 1.56x.
  const MatrixXf U = (bd_test::gaussian(256, 32, 51) / 16).cast<float>(), V = (bd_test::gaussian(192, 32, 52) / 6).cast<float>();
  bd::nn::LowRankLinear<float> low_rank(U, V);
  auto bd_layer = bd::nn::BDLinear<float>::from_low_rank(low_rank, bd::Options{}.with_basis(bd::Basis::Pivoted));
  low_rank.set_compute(Compute::BF16), bd_layer.set_compute(Compute::BF16);
  const MatrixXd x = bd_test::gaussian(40, 256, 53);
  const MatrixXd exact = x * U.cast<double>() * V.cast<double>().transpose();
  const double twin = rel_error(low_rank.forward(x.cast<float>()), exact), bd = rel_error(bd_layer.forward(x.cast<float>()), exact);
  INFO("low-rank twin bf16 " << twin << ", BDLinear bf16 " << bd);
  CHECK(twin > 1e-3);
  CHECK(bd <= 2.0 * twin);
}

TEST_CASE("bf16 compute: a layer that cannot honour it refuses it by name", "[bf16]") {
  bd::nn::DenseLinear<Eigen::half> half(MatrixXf::Ones(4, 3).cast<Eigen::half>());
  BD_CHECK_THROWS_CONTAINING(half.set_compute(Compute::BF16), bd::RangeError,
                             Contains("DenseLinear<f16>: bf16 compute would round its f16 weights a second time"));
  bd::nn::DenseLinear<double> wide(MatrixXd::Ones(4, 3));
  BD_CHECK_THROWS_CONTAINING(wide.set_compute(Compute::BF16), bd::RangeError,
                             Contains("DenseLinear<f64>: bf16 compute multiplies bf16 operands in f32 arithmetic"));
  CHECK_NOTHROW(wide.set_compute(Compute::F32));
  // Asked for in a layer's config: refused when the layer is built.
  const auto layer = bd_test::random_attention(bd_test::LayerSpec{}, 61);
  bd::nn::AttentionConfig config = layer.config();
  config.compute = Compute::BF16;
  BD_CHECK_THROWS_CONTAINING(MultiHeadAttention<Eigen::half>(config, layer.weights().cast<Eigen::half>()), bd::RangeError,
                             Contains("attention<f16>: bf16 compute would round"));
  CHECK_NOTHROW(MultiHeadAttention<float>(config, layer.weights().cast<float>()));
  BD_CHECK_THROWS_CONTAINING(MultiHeadAttention<float>(layer.config(), layer.weights().cast<float>())
                                 .set_compute(Compute::BF16)
                                 .template cast<Eigen::half>(),
                             bd::RangeError, Contains("f16"));
}

namespace {
/// A DeepSeek-like MLA layer (query LoRA, latent 48, decoupled RoPE 8) with `heads` query heads.
bd_test::LayerSpec mla_spec(Index heads) {
  bd_test::LayerSpec s;
  s.n_q = s.n_kv = heads, s.head_dim = 16, s.v_head_dim = 16, s.rope_dim = 8;
  s.d_q = s.d_model_kv = s.d_out = 64, s.d_kv = 48, s.q_lora = 32;
  s.causal = true;
  return s;
}

using Cache = bd::nn::LatentCache<float>;

/// A layer's outputs for 9 tokens on `cache`: 5 prefilled by recomputing K and V, 2 prefilled
/// absorbed, then 2 decoded one at a time (absorbed); rows 5… are the absorbed steps'.
template <typename Layer>
MatrixXf steps(const Layer& layer, const MatrixXf& x, Cache& cache) {
  MatrixXf y(9, x.cols());
  y.topRows(5) = layer.prefill(x.topRows(5), cache, bd::nn::PrefillPath::Recompute);
  y.middleRows(5, 2) = layer.prefill(x.middleRows(5, 2), cache, bd::nn::PrefillPath::Absorbed);
  for (Index t = 7; t < 9; ++t) y.row(t) = layer.decode_absorbed(x.row(t), cache);
  return y;
}
}  // namespace

TEST_CASE("a bf16 latent cache holds each latent rounded once, widens it exactly, and refuses what it cannot hold",
          "[bf16][mla]") {
  const MatrixXf c = bd_test::gaussian(7, 48, 71).cast<float>(), kr = bd_test::gaussian(7, 8, 72).cast<float>();
  Cache cache(bd::Storage::BF16);
  CHECK(cache.storage() == bd::Storage::BF16);
  for (Index t = 0; t < 7; ++t) cache.append(c.row(t), kr.row(t));  // grows from one token: its rows kept
  CHECK(cache.length() == 7);
  CHECK(cache.latent_dim() == 48);
  CHECK(cache.rope_dim() == 8);
  CHECK(cache.latent_bf16() == c.cast<Eigen::bfloat16>());
  CHECK(cache.rope_keys_bf16() == kr.cast<Eigen::bfloat16>());
  const auto [latent, rope] = cache.rows(2, 4);
  CHECK(latent == c.middleRows(2, 4).cast<Eigen::bfloat16>().cast<float>());
  CHECK(rope == kr.middleRows(2, 4).cast<Eigen::bfloat16>().cast<float>());
  CHECK(latent != c.middleRows(2, 4));  // rounded: the storage was honoured
  cache.truncate(3);
  CHECK(cache.rows(0, 3).first == c.topRows(3).cast<Eigen::bfloat16>().cast<float>());
  BD_CHECK_THROWS_CONTAINING(cache.rows(2, 4), bd::RangeError, Contains("the cache holds 3 tokens"));
  BD_CHECK_THROWS_CONTAINING(cache.latent(), bd::RangeError, Contains("this cache stores bf16; read it with latent_bf16()"));
  BD_CHECK_THROWS_CONTAINING(cache.append(MatrixXf::Ones(1, 40), MatrixXf::Ones(1, 8)), bd::ShapeError,
                             Contains("latents of width 48"));
  BD_CHECK_THROWS_CONTAINING(Cache(bd::Storage::F16), bd::RangeError, Contains("f16 storage is not implemented"));
  BD_CHECK_THROWS_CONTAINING(bd::nn::LatentCache<double>(bd::Storage::BF16), bd::RangeError,
                             Contains("a bf16 cache is read by f32 arithmetic"));
  CHECK(Cache().storage() == bd::Storage::F32);
}

TEST_CASE("a bf16 latent cache: bf16 compute decodes with the f32 cache's bits, f32 compute within the latents' rounding",
          "[bf16][mla]") {
  // bf16 compute rounds the latent once wherever it multiplies it (the attention's keys and
  // values, the K/V up-projection's input), so a cache that stores it rounded changes no bit of
  // the absorbed steps, whose attention runs tiled with 16 heads against the one latent. The
  // recomputing prefill differs where f32 arithmetic reads the cache: BD's basis channels (z[S])
  // and the few-row attention's RoPE keys (5 rows per head); f32 compute reads the rounded latent
  // where it read the exact one: the output moves by the latent's rounding, 2⁻⁹ relative, carried
  // through the scores' softmax and the two projections — under 2⁻⁶ of the output's scale (2⁻⁹
  // to 2⁻⁷·⁹ measured on this shape), and never zero. Four heads take the few-row path (f32
  // arithmetic on the widened cache) in both computes. BD and dense on the same bf16 cache differ
  // by their own bf16 errors (2⁻⁷ measured; bound 2⁻⁵), in f32 compute by the fp32 bound.
  const MatrixXd x = bd_test::gaussian(9, 64, 73);
  const MatrixXf xf = x.cast<float>();
  for (const Index heads : {16, 4}) {
    const auto layer = bd_test::random_attention(mla_spec(heads), 74);
    MultiHeadAttention<float> dense = layer.cast<float>();
    BDAttention<float> bd = BDAttention<float>::prepare(layer, BDAttentionOptions{}.with_cost_policy(bd::nn::CostPolicy::Allow));
    for (const Compute compute : {Compute::BF16, Compute::F32}) {
      INFO(heads << " heads, " << bd::kernel::to_string(compute) << " compute");
      dense.set_compute(compute), bd.set_compute(compute);
      Cache dense32, dense16(bd::Storage::BF16), bd32, bd16(bd::Storage::BF16);
      const MatrixXf d32 = steps(dense, xf, dense32), d16 = steps(dense, xf, dense16);
      const MatrixXf b32 = steps(bd, xf, bd32), b16 = steps(bd, xf, bd16);
      if (compute == Compute::BF16 && heads == 16) {
        CHECK(d16.bottomRows(4) == d32.bottomRows(4));
        CHECK(b16.bottomRows(4) == b32.bottomRows(4));
        CHECK(max_rel(d16, d32) <= std::ldexp(1.0, -6));
        CHECK(max_rel(b16, b32) <= std::ldexp(1.0, -6));
      } else {
        CHECK(max_rel(d16, d32) <= std::ldexp(1.0, -6));
        CHECK(max_rel(b16, b32) <= std::ldexp(1.0, -6));
        CHECK(d16.bottomRows(4) != d32.bottomRows(4));
      }
      CHECK(max_rel(b16, d16) <= (compute == Compute::F32 ? bd_test::kFp32OperatorBound : std::ldexp(1.0, -5)));
    }
  }
}

TEST_CASE("a bf16 KV cache holds each key and value rounded once and refuses what it cannot hold", "[bf16]") {
  const MatrixXf k = bd_test::gaussian(6, 32, 81).cast<float>(), v = bd_test::gaussian(6, 24, 82).cast<float>();
  const MatrixXf kr = bd_test::gaussian(6, 8, 85).cast<float>();
  bd::nn::KVCache<float> cache(bd::Storage::BF16);
  CHECK(cache.storage() == bd::Storage::BF16);
  for (Index t = 0; t < 6; ++t) cache.append(k.row(t), v.row(t), kr.row(t));  // grows from one token: its rows kept
  CHECK(cache.length() == 6);
  CHECK(cache.keys_bf16() == k.cast<Eigen::bfloat16>());
  CHECK(cache.values_bf16() == v.cast<Eigen::bfloat16>());
  CHECK(cache.rope_keys_bf16() == kr.cast<Eigen::bfloat16>());
  CHECK(cache.keys_bf16().cast<float>() != k);  // rounded: the storage was honoured
  cache.truncate(2);
  CHECK(cache.values_bf16() == v.topRows(2).cast<Eigen::bfloat16>());
  BD_CHECK_THROWS_CONTAINING(cache.keys(), bd::RangeError, Contains("this cache stores bf16; read it with keys_bf16()"));
  BD_CHECK_THROWS_CONTAINING(cache.append(MatrixXf::Ones(1, 16), MatrixXf::Ones(1, 24), kr.topRows(1)), bd::ShapeError,
                             Contains("keys of width 32"));
  BD_CHECK_THROWS_CONTAINING(bd::nn::KVCache<float>(bd::Storage::F16), bd::RangeError, Contains("f16 storage is not implemented"));
  BD_CHECK_THROWS_CONTAINING(bd::nn::KVCache<double>(bd::Storage::BF16), bd::RangeError,
                             Contains("a bf16 cache is read by f32 arithmetic"));
  BD_CHECK_THROWS_CONTAINING(bd::nn::KVCache<float>().keys_bf16(), bd::RangeError, Contains("read it with keys()"));
}

TEST_CASE("a bf16 KV cache: bf16 compute prefills a chunk with the f32 cache's bits, decodes within the keys' rounding",
          "[bf16]") {
  // GQA under RoPE, 8 query heads on 2 key/value heads. bf16 compute rounds keys and values once
  // wherever the tiled attention multiplies them, so a cache that stores them rounded changes no
  // bit of a chunk's attention (12 tokens: 48 rows per key head, tiled). One token (4 rows per key
  // head) takes the few-row path, f32 arithmetic on the widened cache, as does f32 compute
  // everywhere: the output moves by the keys' and values' rounding, 2⁻⁹ relative, carried through
  // the softmax and the output projection — under 2⁻⁶ of the output's scale, and never zero. BD
  // and dense, each on a bf16 cache, differ by their bf16 errors and their caches' roundings
  // (BD's holds other values: x·B where dense holds x·W_v): bound 2⁻⁵.
  bd_test::LayerSpec spec;
  spec.n_q = 8, spec.n_kv = 2, spec.head_dim = 16, spec.d_q = spec.d_kv = spec.d_out = 64;
  spec.causal = true, spec.rope_theta = 10000;
  const auto layer = bd_test::random_attention(spec, 83);
  MultiHeadAttention<float> dense = layer.cast<float>();
  BDAttention<float> bd = BDAttention<float>::prepare(
      layer, BDAttentionOptions{}.with_mode(bd::nn::Mode::VO).with_cost_policy(bd::nn::CostPolicy::Allow));
  const MatrixXf x = bd_test::gaussian(15, 64, 84).cast<float>();
  const auto steps = [&](const auto& l, bd::nn::KVCache<float>& cache) {
    MatrixXf y(15, 64);
    y.topRows(12) = l.decode(x.topRows(12), cache);
    for (Index t = 12; t < 15; ++t) y.row(t) = l.decode(x.row(t), cache);
    return y;
  };
  for (const Compute compute : {Compute::BF16, Compute::F32}) {
    INFO(bd::kernel::to_string(compute) << " compute");
    dense.set_compute(compute), bd.set_compute(compute);
    bd::nn::KVCache<float> dense32, dense16(bd::Storage::BF16), bd32, bd16(bd::Storage::BF16);
    const MatrixXf d32 = steps(dense, dense32), d16 = steps(dense, dense16);
    const MatrixXf b32 = steps(bd, bd32), b16 = steps(bd, bd16);
    if (compute == Compute::BF16) {
      CHECK(d16.topRows(12) == d32.topRows(12));
      CHECK(b16.topRows(12) == b32.topRows(12));
    }
    CHECK(max_rel(d16, d32) <= std::ldexp(1.0, -6));
    CHECK(max_rel(b16, b32) <= std::ldexp(1.0, -6));
    CHECK(d16.bottomRows(3) != d32.bottomRows(3));
    CHECK(max_rel(b16, d16) <= std::ldexp(1.0, -5));
  }
}
