// nn_support.hpp's layers and oracle, compiled once per test build (bd_test_nn_support).
#include "nn_support.hpp"

#include <cmath>

namespace bd_test {

bd::nn::MultiHeadAttention<double> random_attention(const LayerSpec& s, unsigned seed) {
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

Eigen::MatrixXd plain_rope(Eigen::MatrixXd x, Eigen::Index heads, Eigen::Index dim, double theta, Eigen::Index first) {
  const Eigen::Index half = dim / 2;
  for (Eigen::Index i = 0; i < x.rows(); ++i)
    for (Eigen::Index h = 0; h < heads; ++h)
      for (Eigen::Index k = 0; k < half; ++k) {
        const double angle = double(first + i) / std::pow(theta, 2.0 * double(k) / double(dim));
        const double a = x(i, h * dim + k), b = x(i, h * dim + k + half);
        x(i, h * dim + k) = a * std::cos(angle) - b * std::sin(angle);
        x(i, h * dim + k + half) = b * std::cos(angle) + a * std::sin(angle);
      }
  return x;
}

Eigen::MatrixXd plain_attention(const bd::nn::MultiHeadAttention<double>& layer, const Eigen::MatrixXd& x,
                                const Eigen::MatrixXd& x_kv) {
  using Eigen::Index;
  using Eigen::MatrixXd;
  const auto& c = layer.config();
  const auto& w = layer.weights();
  const auto rms = [&](const MatrixXd& m, const Eigen::VectorXd& g) {
    MatrixXd out = m;
    for (Index i = 0; i < m.rows(); ++i)
      out.row(i) = m.row(i) / std::sqrt(m.row(i).squaredNorm() / double(m.cols()) + c.norm_eps);
    return g.size() ? MatrixXd(out * g.asDiagonal()) : out;
  };
  const auto bias = [](MatrixXd m, const Eigen::VectorXd& b) {
    if (b.size()) m.rowwise() += b.transpose();
    return m;
  };
  const MatrixXd xq = w.W_qa.size() ? rms(x * w.W_qa, w.q_norm) : x;
  const MatrixXd z = w.W_dkv.size() ? rms(x_kv * w.W_dkv, w.kv_norm) : x_kv;
  MatrixXd Q = bias(xq * w.Wq, w.bq), K = bias(z * w.Wk, w.bk);
  const MatrixXd V = bias(z * w.Wv, w.bv);
  if (c.rope_theta > 0) {
    Q = plain_rope(Q, c.n_q, c.head_dim, c.rope_theta, 0);
    K = plain_rope(K, c.n_kv, c.head_dim, c.rope_theta, 0);
  }
  MatrixXd Qr, Kr;
  if (c.rope_dim) {
    Qr = plain_rope(xq * w.Wq_rope, c.n_q, c.rope_dim, c.rope_dim_theta, 0);
    Kr = plain_rope(x_kv * w.Wk_rope, 1, c.rope_dim, c.rope_dim_theta, 0);
  }
  const Index dh = c.head_dim, dv = c.value_dim(), Lq = x.rows(), Lk = x_kv.rows();
  MatrixXd O(Lq, c.n_q * dv);
  for (Index h = 0; h < c.n_q; ++h) {
    const Index g = h / c.group();
    MatrixXd S = Q.middleCols(h * dh, dh) * K.middleCols(g * dh, dh).transpose();
    if (c.rope_dim) S += Qr.middleCols(h * c.rope_dim, c.rope_dim) * Kr.transpose();
    S *= c.softmax_scale();
    for (Index i = 0; i < Lq; ++i) {
      const Index visible = c.causal ? std::min(Lk, i + 1) : Lk;
      const double top = S.row(i).head(visible).maxCoeff();
      S.row(i).head(visible) = (S.row(i).head(visible).array() - top).exp().matrix();
      S.row(i).tail(Lk - visible).setZero();
      S.row(i) /= S.row(i).sum();
    }
    O.middleCols(h * dv, dv) = S * V.middleCols(g * dv, dv);
  }
  return bias(O * w.Wo, w.bo);
}

}  // namespace bd_test
