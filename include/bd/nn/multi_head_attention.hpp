// bd/nn/multi_head_attention.hpp — the dense attention layer: what every BD operator must equal.
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
//
// The algorithm (forward, decode, prefill, decode_absorbed) is attention_layer.hpp's, shared
// with BDAttention; this class is its dense projection policy (dense_projections.hpp).
#pragma once

#include <utility>

#include <Eigen/Core>

#include "bd/core/error.hpp"
#include "bd/core/scalar.hpp"
#include "bd/nn/attention_config.hpp"
#include "bd/nn/attention_core.hpp"
#include "bd/nn/attention_layer.hpp"
#include "bd/nn/cost_model.hpp"
#include "bd/nn/dense_projections.hpp"

namespace bd::nn {

template <typename S = float>
class MultiHeadAttention : public AttentionLayer<MultiHeadAttention<S>, acc_t<S>> {
public:
  using Scalar = S;
  using A = acc_t<S>;
  using Matrix = MatrixA<A>;
  using Input = Eigen::Ref<const Matrix>;
  using Cache = KVCache<A>;
  using Latent = LatentCache<A>;

  MultiHeadAttention() = default;
  MultiHeadAttention(AttentionConfig config, AttentionWeights<S> weights)
      : config_(std::move(config)), weights_(std::move(weights)) {
    detail::validate_attention(config_, weights_);
    shape_ = AttentionShape::of(config_, weights_);
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

private:
  friend class AttentionLayer<MultiHeadAttention<S>, A>;

  // The projection policy (attention_layer.hpp): every product dense.
  const AttentionWeights<S>& shared_weights() const { return weights_; }
  Matrix queries(const Input& xq, Index first) const { return detail::dense_queries<A>(config_, weights_, xq, first); }
  Matrix keys(const Input& z, Index first) const { return detail::dense_keys<A>(config_, weights_, z, first); }
  Matrix values(const Input& z) const { return detail::dense_values<A>(weights_, z); }
  Matrix output(const Input& O) const { return detail::dense_output<A>(weights_, O); }
  Matrix absorb_queries(const Matrix& Q) const { return detail::dense_absorb_queries<A>(config_, weights_, Q); }
  Matrix absorb_values(const Matrix& Ot) const { return detail::dense_absorb_values<A>(config_, weights_, Ot); }
  const AttentionShape& layer_shape() const { return shape_; }
  Mode cost_mode() const { return Mode::QKVO; }
  bool decomposed() const { return false; }

  AttentionConfig config_;
  AttentionWeights<S> weights_;
  AttentionShape shape_;
};

}  // namespace bd::nn
