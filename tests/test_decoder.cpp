// A LLaMA decoder of any linear layers: decoding with the KV cache equals the whole-sequence
// forward, attention over linear layers equals the dense attention it is made of, and a
// low-rank-pruned model's BD form (every linear layer in BD form: the paper's "BD from low-rank")
// equals it with r² fewer parameters per layer.
#include <bd/nn/llama.hpp>

#include <vector>

#include "nn_support.hpp"

using bd::nn::DenseLinear;
using bd::nn::LowRankLinear;
using bd::nn::ProjectedAttention;
using bd_test::gaussian;
using bd_test::max_rel;
using Catch::Contains;
using Eigen::Index;
using Eigen::MatrixXd;

namespace {

struct Shape {
  Index d = 48, ff = 80, heads = 4, kv_heads = 2, head_dim = 12, vocab = 37, layers = 2;
};

/// A random low-rank decoder: every linear layer U·Vᵀ at rank `rank(d_in, d_out)`.
bd::nn::LlamaModel<double, ProjectedAttention<LowRankLinear<double>>, LowRankLinear<double>> low_rank_model(const Shape& s,
                                                                                                           unsigned seed) {
  unsigned salt = seed * 1000;
  auto linear = [&](Index in, Index out) {
    const Index r = std::max<Index>(2, in * out / (in + out) * 4 / 5);  // 80 % of the dense parameters
    salt += 3;
    return LowRankLinear<double>(gaussian(in, r, salt) / std::sqrt(double(in)), gaussian(out, r, salt + 1) / std::sqrt(double(r)),
                                 gaussian(out, 1, salt + 2) / 10);
  };
  bd::nn::LlamaModel<double, ProjectedAttention<LowRankLinear<double>>, LowRankLinear<double>> m;
  m.config.hidden = s.d, m.config.intermediate = s.ff, m.config.layers = s.layers, m.config.heads = s.heads;
  m.config.kv_heads = s.kv_heads, m.config.vocab = s.vocab, m.config.head_dim = s.head_dim;
  m.embedding = gaussian(s.vocab, s.d, ++salt);
  m.lm_head = gaussian(s.d, s.vocab, ++salt) / std::sqrt(double(s.d));
  m.final_norm = (gaussian(s.d, 1, ++salt).array().abs() + 0.5).matrix();
  bd::nn::AttentionConfig c;
  c.n_q = s.heads, c.n_kv = s.kv_heads, c.head_dim = s.head_dim, c.causal = true, c.rope_theta = 10000;
  for (Index l = 0; l < s.layers; ++l) {
    ProjectedAttention<LowRankLinear<double>> attention(c, linear(s.d, s.heads * s.head_dim),
                                                        linear(s.d, s.kv_heads * s.head_dim),
                                                        linear(s.d, s.kv_heads * s.head_dim), linear(s.heads * s.head_dim, s.d));
    m.layers.push_back({(gaussian(s.d, 1, ++salt).array().abs() + 0.5).matrix(),
                        (gaussian(s.d, 1, ++salt).array().abs() + 0.5).matrix(), std::move(attention), linear(s.d, s.ff),
                        linear(s.d, s.ff), linear(s.ff, s.d)});
  }
  return m;
}

std::vector<int> some_tokens(Index n, Index vocab) {
  std::vector<int> t;
  for (Index i = 0; i < n; ++i) t.push_back(int((7 * i * i + 3 * i + 1) % vocab));
  return t;
}

/// Decodes `tokens` in chunks of the given sizes (cycled) and stacks the logits.
template <typename Model>
MatrixXd decode_in_chunks(const Model& m, const std::vector<int>& tokens, const std::vector<std::size_t>& chunks) {
  typename Model::Cache cache;
  MatrixXd out(Index(tokens.size()), m.config.vocab);
  std::size_t at = 0;
  for (std::size_t i = 0; at < tokens.size(); ++i) {
    const std::size_t n = std::min(chunks[i % chunks.size()], tokens.size() - at);
    const std::vector<int> chunk(tokens.begin() + long(at), tokens.begin() + long(at + n));
    out.middleRows(Index(at), Index(n)) = m.decode(chunk, cache).template cast<double>();
    at += n;
  }
  CHECK(cache.length() == Index(tokens.size()));
  return out;
}

}  // namespace

TEST_CASE("attention over linear layers equals the dense attention of the same weights", "[decoder][attention]") {
  bd_test::LayerSpec s;
  s.n_q = 6, s.n_kv = 2, s.head_dim = 8, s.biases = true, s.causal = true, s.rope_theta = 10000;
  const auto dense = bd_test::random_attention(s, 3);
  const auto& w = dense.weights();
  const ProjectedAttention<DenseLinear<double>> layer(dense.config(), DenseLinear<double>(w.Wq, w.bq),
                                                     DenseLinear<double>(w.Wk, w.bk), DenseLinear<double>(w.Wv, w.bv),
                                                     DenseLinear<double>(w.Wo, w.bo));
  CHECK(layer.parameters() == dense.parameters());
  const MatrixXd x = gaussian(11, s.d_q, 4);
  CHECK(max_rel(layer.forward(x), bd_test::plain_attention(dense, x, x)) < 1e-13);
  bd::nn::KVCache<double> cache;
  const MatrixXd first = layer.decode(x.topRows(7), cache), rest = layer.decode(x.bottomRows(4), cache);
  MatrixXd both(11, s.d_out);
  both << first, rest;
  CHECK(max_rel(both, bd_test::plain_attention(dense, x, x)) < 1e-13);
}

TEST_CASE("attention over linear layers refuses projections that do not fit its heads", "[decoder][bad-input]") {
  bd::nn::AttentionConfig c;
  c.n_q = 4, c.n_kv = 2, c.head_dim = 8;
  const DenseLinear<double> q(gaussian(16, 32, 1)), kv(gaussian(16, 16, 2)), o(gaussian(32, 16, 3));
  CHECK_NOTHROW(ProjectedAttention<DenseLinear<double>>(c, q, kv, kv, o));
  BD_CHECK_THROWS_CONTAINING(ProjectedAttention<DenseLinear<double>>(c, q, q, kv, o), bd::ShapeError,
                             Contains("k's output width is 32, expected 16"));
  BD_CHECK_THROWS_CONTAINING(ProjectedAttention<DenseLinear<double>>(c, q, kv, kv, q), bd::ShapeError,
                             Contains("o's input width is 16, expected 32"));
  c.rope_dim = 4;
  BD_CHECK_THROWS_CONTAINING(ProjectedAttention<DenseLinear<double>>(c, q, kv, kv, o), bd::RefusedError,
                             Contains("no decoupled RoPE"));
}

TEST_CASE("decoding with the KV cache equals the whole-sequence logits, in any chunks", "[decoder]") {
  const auto model = low_rank_model(Shape{}, 1);
  const std::vector<int> tokens = some_tokens(23, 37);
  const MatrixXd whole = model.logits(tokens);
  for (const std::vector<std::size_t>& chunks : {std::vector<std::size_t>{1}, {5, 1, 3}, {23}}) {
    INFO("chunks starting " << chunks.front());
    CHECK(max_rel(decode_in_chunks(model, tokens, chunks), whole) < 1e-12);
  }
  typename decltype(model)::Cache cache;
  model.decode(some_tokens(4, 37), cache);
  cache.truncate(2);  // forget two tokens: decoding goes on from position 2
  CHECK(max_rel(model.decode({tokens[2], tokens[3]}, cache), whole.middleRows(2, 2)) < 1e-12);
  BD_CHECK_THROWS_CONTAINING(model.decode({37}, cache), bd::RangeError, Contains("outside the vocabulary of 37"));
}

TEST_CASE("a low-rank model's BD form equals it with r^2 fewer parameters per linear layer", "[decoder][linear]") {
  const Shape s;
  const auto low_rank = low_rank_model(s, 2);
  const auto bd_model = low_rank.with_bd_linear(bd::Options{}.with_basis(bd::Basis::Pivoted));
  const std::vector<int> tokens = some_tokens(19, s.vocab);
  const MatrixXd exact = low_rank.logits(tokens);
  // Each BD layer equals its low-rank layer to rounding (BD is exact for a rank-r product).
  CHECK(max_rel(bd_model.logits(tokens), exact) < 1e-11);
  CHECK(max_rel(decode_in_chunks(bd_model, tokens, {4, 1}), exact) < 1e-11);
  Index saved = 0;
  for (const auto& l : low_rank.layers) {
    for (const auto* lin : {&l.attention.q(), &l.attention.k(), &l.attention.v(), &l.attention.o(), &l.gate, &l.up, &l.down})
      saved += lin->rank() * lin->rank();
  }
  CHECK(low_rank.layer_parameters() - bd_model.layer_parameters() == saved);
}

TEST_CASE("the dense LLaMA decoder decodes what its forward computes, in float on the kernel", "[decoder][kernel]") {
  // The dense model (MultiHeadAttention, DenseLinear MLP) made from the low-rank one's products.
  const Shape s;
  const auto low_rank = low_rank_model(s, 3);
  bd::nn::LlamaModel<double> dense;
  dense.config = low_rank.config;
  dense.embedding = low_rank.embedding, dense.lm_head = low_rank.lm_head, dense.final_norm = low_rank.final_norm;
  auto W = [](const LowRankLinear<double>& l) { return MatrixXd(l.U() * l.V().transpose()); };
  for (const auto& l : low_rank.layers) {
    bd::nn::AttentionWeights<double> w;
    const auto& a = l.attention;
    w.Wq = W(a.q()), w.Wk = W(a.k()), w.Wv = W(a.v()), w.Wo = W(a.o());
    w.bq = a.q().bias(), w.bk = a.k().bias(), w.bv = a.v().bias(), w.bo = a.o().bias();
    dense.layers.push_back({l.attn_norm, l.mlp_norm, bd::nn::MultiHeadAttention<double>(a.config(), w),
                            DenseLinear<double>(W(l.gate), l.gate.bias()), DenseLinear<double>(W(l.up), l.up.bias()),
                            DenseLinear<double>(W(l.down), l.down.bias())});
  }
  const std::vector<int> tokens = some_tokens(17, s.vocab);
  const MatrixXd exact = low_rank.logits(tokens);
  CHECK(max_rel(dense.logits(tokens), exact) < 1e-11);
  const auto single = dense.cast<float>();
  bd_test::for_each_isa([&] {
    CHECK(max_rel(single.logits(tokens), exact) < 1e-4);
    CHECK(max_rel(decode_in_chunks(single, tokens, {1, 6}), exact) < 1e-4);
  });
}
