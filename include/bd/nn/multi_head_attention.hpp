// bd/nn/multi_head_attention.hpp — the dense attention layer, written plainly: the oracle every
// BD operator is compared against. Weights are stored in S and arithmetic runs in acc_t<S>.
//
//   z      = x_kv                    (or RMSNorm(x_kv·W_dkv)·g for MLA)
//   Q = x·Wq + bq,  K = z·Wk + bk,  V = z·Wv + bv          (RoPE on Q, K when rope_theta > 0)
//   O_h    = softmax(Q_h·K_gᵀ·scale [+ Qr_h·Krᵀ·scale])·V_g,   g = h / (n_q/n_kv)
//   y      = [O_1 … O_n]·Wo + bo
#pragma once

#include <utility>

#include <Eigen/Core>

#include "bd/core/error.hpp"
#include "bd/core/scalar.hpp"
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

  MultiHeadAttention() = default;
  MultiHeadAttention(AttentionConfig config, AttentionWeights<S> weights)
      : config_(std::move(config)), weights_(std::move(weights)) {
    detail::validate_attention(config_, weights_);
  }

  const AttentionConfig& config() const { return config_; }
  const AttentionWeights<S>& weights() const { return weights_; }
  Index input_dim() const { return weights_.Wq.rows(); }
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
    Matrix Q = x * detail::widen<A>(weights_.Wq);
    detail::add_bias<A>(Q, weights_.bq);
    if (config_.rope_theta > 0) apply_rope(Q, config_.n_q, config_.head_dim, config_.rope_theta, first_position);
    const Matrix O = detail::attend_heads<A>(config_, weights_, x, Q, K, V, Kr, config_.n_kv, config_.n_kv, first_position);
    Matrix y = O * detail::widen<A>(weights_.Wo);
    detail::add_bias<A>(y, weights_.bo);
    return y;
  }

  AttentionConfig config_;
  AttentionWeights<S> weights_;
};

}  // namespace bd::nn
