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

#include <tuple>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "bd/base/error.hpp"
#include "bd/core/scalar.hpp"
#include "bd/nn/attention_config.hpp"
#include "bd/nn/attention_layer.hpp"
#include "bd/nn/cost_model.hpp"
#include "bd/nn/decoding_cache.hpp"
#include "bd/nn/dense_projections.hpp"
#include "bd/nn/gradients.hpp"
#include "bd/nn/types.hpp"

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
  using StoredMatrix = nn::StoredMatrix<S>;

  MultiHeadAttention() = default;
  MultiHeadAttention(AttentionConfig config, AttentionWeights<S> weights)
      : config_(std::move(config)), weights_(std::move(weights)) {
    detail::validate_attention(config_, weights_);
    shape_ = AttentionShape::of(config_, weights_);
  }

  const AttentionConfig& config() const { return config_; }
  const AttentionWeights<S>& weights() const { return weights_; }

  /// The arithmetic of the layer's products (compute.hpp): f32, or bf16 (the projections, and the
  /// attention's as AttentionConfig::compute says). RangeError where the stored type cannot
  /// honour bf16 (f64, f16).
  MultiHeadAttention& set_compute(Compute compute) {
    detail::require_compute<S>(compute, "MultiHeadAttention");
    config_.compute = compute;
    return *this;
  }
  Compute compute() const { return config_.compute; }
  Index input_dim() const { return detail::query_input_dim(weights_); }
  Index kv_input_dim() const { return weights_.W_dkv.size() ? weights_.W_dkv.rows() : weights_.Wk.rows(); }
  Index output_dim() const { return weights_.Wo.cols(); }
  /// Parameters of the q, k, v, o projections (BDAttention::parameters()'s dense count).
  Index parameters() const { return weights_.Wq.size() + weights_.Wk.size() + weights_.Wv.size() + weights_.Wo.size(); }

  /// Training: Wq, bq, Wk, bk, Wv, bv, Wo, bo as views (the biases the layer has; x·W
  /// orientation). MLA's latent, query LoRA and RoPE projections are not trainable here.
  std::vector<Parameter<S>> trainable() {
    std::vector<Parameter<S>> out;
    auto& w = weights_;
    for (auto [name, m, b, bias_name] : {std::tuple{"Wq", &w.Wq, &w.bq, "bq"}, std::tuple{"Wk", &w.Wk, &w.bk, "bk"},
                                         std::tuple{"Wv", &w.Wv, &w.bv, "bv"}, std::tuple{"Wo", &w.Wo, &w.bo, "bo"}}) {
      out.push_back(detail::parameter(name, *m));
      if (b->size()) out.push_back(detail::parameter(bias_name, *b));
    }
    return out;
  }

  /// The same layer with weights rounded once to T.
  template <typename T>
  MultiHeadAttention<T> cast() const {
    return MultiHeadAttention<T>(config_, weights_.template cast<T>());
  }

private:
  friend class AttentionLayer<MultiHeadAttention<S>, A>;

  // The projection policy (attention_layer.hpp): every product dense.
  const AttentionWeights<S>& shared_weights() const { return weights_; }
  using Scratch = ScratchMatrix<A>;
  using View = Eigen::Map<Matrix>;
  View queries(const Input& xq, Index first, Scratch& out, Workspace& ws) const {
    return detail::dense_queries<A>(config_, weights_, xq, first, out, ws);
  }
  View keys(const Input& z, Index first, Scratch& out, Workspace& ws) const {
    return detail::dense_keys<A>(config_, weights_, z, first, out, ws);
  }
  View values(const Input& z, Scratch& out, Workspace& ws) const {
    return detail::dense_values<A>(config_, weights_, z, out, ws);
  }
  Matrix output(const Input& O, Workspace& ws) const { return detail::dense_output<A>(config_, weights_, O, ws); }
  Matrix absorb_queries(const Input& Q, Workspace& ws) const { return detail::dense_absorb_queries<A>(config_, weights_, Q, ws); }
  Matrix absorb_values(const Input& Ot, Workspace& ws) const { return detail::dense_absorb_values<A>(config_, weights_, Ot, ws); }
  const AttentionShape& layer_shape() const { return shape_; }
  Mode cost_mode() const { return Mode::QKVO; }
  bool decomposed() const { return false; }

  // Backward (attention_layer.hpp): gradients in trainable()'s order, [W, b?] per projection.
  // One empty slot per trainable tensor (slot(4) counts them): each backward step assigns its
  // projection's gradients whole, so nothing is zeroed first (4 MB per step at d = 512).
  std::vector<Matrix> gradient_slots() const { return std::vector<Matrix>(slot(4)); }
  /// Index in trainable() of projection p's weight (0 q, 1 k, 2 v, 3 o); its bias follows.
  std::size_t slot(int p) const {
    const auto& w = weights_;
    const bool bias[] = {w.bq.size() > 0, w.bk.size() > 0, w.bv.size() > 0, w.bo.size() > 0};
    std::size_t i = 0;
    for (int k = 0; k < p; ++k) i += bias[k] ? 2 : 1;
    return i;
  }
  Matrix projection_backward(int p, const Input& x, const Matrix& dY, const StoredMatrix& W, bool bias,
                             std::vector<Matrix>& g, Workspace& ws) const {
    const std::size_t i = slot(p);
    return detail::dense_projection_backward<A, S>(x, dY, W, g[i], bias ? &g[i + 1] : nullptr, ws);
  }
  Matrix output_backward(const Matrix& O, const Input& dy, std::vector<Matrix>& g, Workspace& ws) const {
    return projection_backward(3, O, dy, weights_.Wo, weights_.bo.size() > 0, g, ws);
  }
  Matrix queries_backward(const Input& xq, Matrix dQ, Index first, std::vector<Matrix>& g, Workspace& ws) const {
    detail::unrotate<A>(config_, dQ, config_.n_q, first);
    return projection_backward(0, xq, dQ, weights_.Wq, weights_.bq.size() > 0, g, ws);
  }
  Matrix keys_backward(const Input& z, Matrix dK, Index first, std::vector<Matrix>& g, Workspace& ws) const {
    detail::unrotate<A>(config_, dK, config_.n_kv, first);
    return projection_backward(1, z, dK, weights_.Wk, weights_.bk.size() > 0, g, ws);
  }
  Matrix values_backward(const Input& z, const Matrix& dV, std::vector<Matrix>& g, Workspace& ws) const {
    return projection_backward(2, z, dV, weights_.Wv, weights_.bv.size() > 0, g, ws);
  }

  AttentionConfig config_;
  AttentionWeights<S> weights_;
  AttentionShape shape_;
};

/// The dense layers bd::compiled holds (src/compiled_nn.cpp), extern under BD_COMPILED_LIB:
/// every stored type the models load, trainable in float and double.
#define BD_MULTI_HEAD_ATTENTION_INSTANTIATIONS(prefix)                      \
  BD_ATTENTION_LAYER_MEMBERS(prefix, MultiHeadAttention<float>, float)      \
  BD_ATTENTION_LAYER_BACKWARD(prefix, MultiHeadAttention<float>, float)     \
  BD_ATTENTION_LAYER_MEMBERS(prefix, MultiHeadAttention<double>, double)    \
  BD_ATTENTION_LAYER_BACKWARD(prefix, MultiHeadAttention<double>, double)   \
  BD_ATTENTION_LAYER_MEMBERS(prefix, MultiHeadAttention<Eigen::half>, float) \
  BD_ATTENTION_LAYER_MEMBERS(prefix, MultiHeadAttention<Eigen::bfloat16>, float)
#if defined(BD_COMPILED_LIB)
BD_MULTI_HEAD_ATTENTION_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::nn
