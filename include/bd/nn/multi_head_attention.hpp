// bd/nn/multi_head_attention.hpp — the dense attention layer, written plainly: the oracle every
// BD operator is compared against. Weights are stored in S and arithmetic runs in acc_t<S>.
//
//   z      = x_kv                    (or RMSNorm(x_kv·W_dkv)·g for MLA)
//   Q = x·Wq + bq,  K = z·Wk + bk,  V = z·Wv + bv          (RoPE on Q, K when rope_theta > 0)
//   O_h    = softmax(Q_h·K_gᵀ·scale [+ Qr_h·Krᵀ·scale])·V_g,   g = h / (n_q/n_kv)
//   y      = [O_1 … O_n]·Wo + bo
//
// MLA (W_dkv set) also decodes over a LatentCache (c and the RoPE key per token), either
// recomputing K = c·Wk, V = c·Wv for the context (prefill, chunked prefill) or absorbed, as
// serving engines run it: Q̃_h = Q_h·Wk_gᵀ (d_c wide), Õ_h = softmax(Q̃_h·cᵀ + Qr_h·Krᵀ)·c,
// O_h = Õ_h·Wv_g + bv_g (softmax rows sum to one). A key bias adds a constant per softmax row
// and drops out of both.
#pragma once

#include <utility>

#include <Eigen/Core>

#include "bd/core/error.hpp"
#include "bd/core/scalar.hpp"
#include "bd/kernel/matmul.hpp"
#include "bd/nn/attention_config.hpp"
#include "bd/nn/attention_core.hpp"
#include "bd/nn/attention_steps.hpp"

namespace bd::nn {

template <typename S = float>
class MultiHeadAttention {
public:
  using Scalar = S;
  using A = acc_t<S>;
  using Matrix = MatrixA<A>;
  using Cache = KVCache<A>;
  using Latent = LatentCache<A>;

  MultiHeadAttention() = default;
  MultiHeadAttention(AttentionConfig config, AttentionWeights<S> weights)
      : config_(std::move(config)), weights_(std::move(weights)) {
    detail::validate_attention(config_, weights_);
  }

  const AttentionConfig& config() const { return config_; }
  const AttentionWeights<S>& weights() const { return weights_; }
  Index input_dim() const { return detail::query_input_dim(weights_); }
  Index kv_input_dim() const { return weights_.W_dkv.size() ? weights_.W_dkv.rows() : weights_.Wk.rows(); }
  Index output_dim() const { return weights_.Wo.cols(); }

  /// The same layer with weights rounded once to T.
  template <typename T>
  MultiHeadAttention<T> cast() const {
    return MultiHeadAttention<T>(config_, weights_.template cast<T>());
  }

  /// Self-attention over a whole sequence (positions 0..L−1).
  Matrix forward(const Matrix& x) const { return forward(x, x); }

  /// Cross-attention: queries from x, keys and values from x_kv.
  Matrix forward(const Matrix& x, const Matrix& x_kv) const {
    require_inputs(x, x_kv);
    Projected p = project_kv(x_kv, 0);
    return attend_and_output(x, p.K, p.V, p.Kr, 0);
  }

  /// Self-attention decoding: appends x_new's keys and values to the cache, attends to all of
  /// them, returns the outputs of the new tokens. Equal to forward() on the whole sequence.
  Matrix decode(const Matrix& x_new, Cache& cache) const {
    require_inputs(x_new, x_new);
    const Index start = cache.length();
    Projected p = project_kv(x_new, start);
    cache.append(p.K, p.V, p.Kr);
    return attend_and_output(x_new, cache.keys(), cache.values(), cache.rope_keys(), start);
  }

  /// MLA prefill or chunked prefill: appends x_new's latents to the cache and attends to the
  /// whole context with K = c·Wk, V = c·Wv. Equal to forward() on the whole sequence.
  Matrix prefill(const Matrix& x_new, Latent& cache) const {
    detail::require_latent_layer(config_, weights_, "prefill over a latent cache");
    require_inputs(x_new, x_new);
    const Index start = cache.length();
    detail::append_latent<A>(config_, weights_, x_new, cache);
    // The context's up-projections dominate a chunk's work: on the dispatched kernel, as BD's
    // K'/V' are, so that dense and BD prefill compare kernels of the same craft.
    Matrix K = bd::kernel::matmul(cache.latent(), detail::widen<A>(weights_.Wk));
    detail::add_bias<A>(K, weights_.bk);
    Matrix V = bd::kernel::matmul(cache.latent(), detail::widen<A>(weights_.Wv));
    detail::add_bias<A>(V, weights_.bv);
    return attend_and_output(x_new, K, V, cache.rope_keys(), start);
  }

  /// MLA decoding absorbed (see the file comment): only the latent cache is read. Equal to
  /// prefill() and to forward() on the whole sequence.
  Matrix decode_absorbed(const Matrix& x_new, Latent& cache) const {
    detail::require_latent_layer(config_, weights_, "absorbed decoding");
    require_inputs(x_new, x_new);
    const AttentionConfig& c = config_;
    const Index start = cache.length(), dh = c.head_dim, dv = c.value_dim(), dc = weights_.Wk.rows();
    detail::append_latent<A>(c, weights_, x_new, cache);
    const Matrix xq = detail::q_source<A>(c, weights_, x_new);
    Matrix Q = xq * detail::widen<A>(weights_.Wq);
    detail::add_bias<A>(Q, weights_.bq);
    const auto& Wk = detail::widen<A>(weights_.Wk);
    const auto& Wv = detail::widen<A>(weights_.Wv);
    Matrix Qt(x_new.rows(), c.n_q * dc);
    for (Index h = 0; h < c.n_q; ++h)
      Qt.middleCols(h * dc, dc).noalias() = Q.middleCols(h * dh, dh) * Wk.middleCols((h / c.group()) * dh, dh).transpose();
    const Matrix Ot = detail::attend_latent<A>(c, weights_, xq, Qt, cache, start);
    Matrix O(x_new.rows(), c.n_q * dv);
    for (Index h = 0; h < c.n_q; ++h) {
      const Index g = h / c.group();
      O.middleCols(h * dv, dv).noalias() = Ot.middleCols(h * dc, dc) * Wv.middleCols(g * dv, dv);
      if (weights_.bv.size()) O.middleCols(h * dv, dv).rowwise() += weights_.bv.segment(g * dv, dv).template cast<A>().transpose();
    }
    Matrix y = O * detail::widen<A>(weights_.Wo);
    detail::add_bias<A>(y, weights_.bo);
    return y;
  }

private:
  struct Projected {
    Matrix K, V, Kr;
  };

  void require_inputs(const Matrix& x, const Matrix& x_kv) const {
    detail::require_attention_inputs(input_dim(), kv_input_dim(), x.cols(), x_kv.cols());
  }

  Projected project_kv(const Matrix& x_kv, Index first_position) const {
    const Matrix z = detail::kv_source<A>(config_, weights_, x_kv);
    Projected p;
    p.K = z * detail::widen<A>(weights_.Wk);
    detail::add_bias<A>(p.K, weights_.bk);
    if (config_.rope_theta > 0) apply_rope(p.K, config_.n_kv, config_.head_dim, config_.rope_theta, first_position);
    p.V = z * detail::widen<A>(weights_.Wv);
    detail::add_bias<A>(p.V, weights_.bv);
    p.Kr = detail::rope_keys<A>(config_, weights_, x_kv, first_position);
    return p;
  }

  Matrix attend_and_output(const Matrix& x, const ConstRef<A>& K, const ConstRef<A>& V, const ConstRef<A>& Kr,
                           Index first_position) const {
    const Matrix xq = detail::q_source<A>(config_, weights_, x);
    Matrix Q = xq * detail::widen<A>(weights_.Wq);
    detail::add_bias<A>(Q, weights_.bq);
    if (config_.rope_theta > 0) apply_rope(Q, config_.n_q, config_.head_dim, config_.rope_theta, first_position);
    const Matrix O = detail::attend_heads<A>(config_, weights_, xq, Q, K, V, Kr, config_.n_kv, config_.n_kv, first_position);
    Matrix y = O * detail::widen<A>(weights_.Wo);
    detail::add_bias<A>(y, weights_.bo);
    return y;
  }

  AttentionConfig config_;
  AttentionWeights<S> weights_;
};

}  // namespace bd::nn
