// Random attention layers for the operator tests.
#pragma once

#include <bd/nn/bd_attention.hpp>

#include "support.hpp"

namespace bd_test {

struct LayerSpec {
  Eigen::Index n_q = 4, n_kv = 4, head_dim = 8, v_head_dim = 0, d_q = 48, d_kv = 48, d_out = 48;
  bool biases = false, causal = false;
  double rope_theta = 0;
  // MLA: keys/values from a latent of width d_kv computed from a d_model_kv input.
  Eigen::Index d_model_kv = 0, rope_dim = 0;
  // Query LoRA: queries from RMSNorm(x·W_qa) of width q_lora (x is d_q wide).
  Eigen::Index q_lora = 0;
};

/// A layer with Gaussian weights scaled like a trained one (1/sqrt(fan_in)), seeded.
inline bd::nn::MultiHeadAttention<double> random_attention(const LayerSpec& s, unsigned seed) {
  bd::nn::AttentionConfig c;
  c.n_q = s.n_q;
  c.n_kv = s.n_kv;
  c.head_dim = s.head_dim;
  c.v_head_dim = s.v_head_dim;
  c.causal = s.causal;
  c.rope_theta = s.rope_theta;
  c.rope_dim = s.rope_dim;
  const Eigen::Index dv = c.value_dim();
  bd::nn::AttentionWeights<double> w;
  auto g = [&](Eigen::Index r, Eigen::Index k, unsigned salt) -> Eigen::MatrixXd {
    return gaussian(r, k, seed * 101 + salt) / std::sqrt(double(r));  // a value: an expression would dangle
  };
  const Eigen::Index d_query = s.q_lora ? s.q_lora : s.d_q;  // what Wq reads
  w.Wq = g(d_query, s.n_q * s.head_dim, 1);
  if (s.q_lora) {
    w.W_qa = g(s.d_q, s.q_lora, 13);
    w.q_norm = (gaussian(s.q_lora, 1, seed + 14).array().abs() + 0.5).matrix();
  }
  w.Wk = g(s.d_kv, s.n_kv * s.head_dim, 2);
  w.Wv = g(s.d_kv, s.n_kv * dv, 3);
  w.Wo = g(s.n_q * dv, s.d_out, 4);
  if (s.biases) {
    w.bq = gaussian(s.n_q * s.head_dim, 1, seed + 5);
    w.bk = gaussian(s.n_kv * s.head_dim, 1, seed + 6);
    w.bv = gaussian(s.n_kv * dv, 1, seed + 7);
    w.bo = gaussian(s.d_out, 1, seed + 8);
  }
  if (s.d_model_kv) {
    w.W_dkv = g(s.d_model_kv, s.d_kv, 9);
    w.kv_norm = (gaussian(s.d_kv, 1, seed + 10).array().abs() + 0.5).matrix();
  }
  if (s.rope_dim) {
    w.Wq_rope = g(d_query, s.n_q * s.rope_dim, 11);
    w.Wk_rope = g(s.d_model_kv ? s.d_model_kv : s.d_kv, s.rope_dim, 12);
  }
  return bd::nn::MultiHeadAttention<double>(c, w);
}

/// max |a − b| / max |b|: the test bound for operators is relative to the output's scale.
template <typename DA, typename DB>
double max_rel(const Eigen::MatrixBase<DA>& a, const Eigen::MatrixBase<DB>& b) {
  return (a.template cast<double>() - b.template cast<double>()).cwiseAbs().maxCoeff() /
         b.template cast<double>().cwiseAbs().maxCoeff();
}

/// fp32 bound for operator outputs (the issue's): max abs error ≤ 1e-4 of the output's scale.
/// fp32 arithmetic over d ≤ 96 terms with coefficients |C| of a few units errs by ~1e-6.
constexpr double kFp32OperatorBound = 1e-4;

}  // namespace bd_test
