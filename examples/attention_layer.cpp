// BDAttention as a drop-in replacement: prepare from a dense layer, compare, decode with a cache.
#include <bd/nn/bd_attention.hpp>

#include <cstdio>

int main() {
  using namespace bd::nn;
  // A GPT-2-like layer: 12 heads of 64 on d = 768, biases, causal, positions added at the embedding.
  AttentionConfig config;
  config.n_q = config.n_kv = 12;
  config.head_dim = 64;
  config.causal = true;
  const int d = 768;
  AttentionWeights<float> w;
  w.Wq = Eigen::MatrixXf::Random(d, d) * 0.036f;
  w.Wk = Eigen::MatrixXf::Random(d, d) * 0.036f;
  w.Wv = Eigen::MatrixXf::Random(d, d) * 0.036f;
  w.Wo = Eigen::MatrixXf::Random(d, d) * 0.036f;
  w.bq = Eigen::VectorXf::Random(d);
  w.bk = Eigen::VectorXf::Random(d);
  w.bv = Eigen::VectorXf::Random(d);
  w.bo = Eigen::VectorXf::Random(d);
  const MultiHeadAttention<float> dense(config, w);

  const auto bda = BDAttention<float>::prepare(dense, BDAttentionOptions{}.with_mode(Mode::QKVO));
  std::printf("%s\n", bda.cost().describe().c_str());
  std::printf("QK: %s\nVO: %s\n", bda.qk_report().reason.c_str(), bda.vo_report().reason.c_str());

  const Eigen::MatrixXf x = Eigen::MatrixXf::Random(32, d);
  const Eigen::MatrixXf y = dense.forward(x), y_bd = bda.forward(x);
  const float rel = (y_bd - y).cwiseAbs().maxCoeff() / y.cwiseAbs().maxCoeff();
  std::printf("max |BD − dense| / max |dense| = %.2e\n", rel);

  KVCache<float> cache;  // K' and V' of past tokens
  Eigen::MatrixXf stepped(32, d);
  for (int t = 0; t < 32; ++t) stepped.row(t) = bda.decode(x.row(t), cache);
  const float decode_rel = (stepped - y_bd).cwiseAbs().maxCoeff() / y_bd.cwiseAbs().maxCoeff();
  std::printf("decoding token by token against the full pass: %.2e\n", decode_rel);
  return rel < 1e-4f && decode_rel < 1e-5f ? 0 : 1;
}
