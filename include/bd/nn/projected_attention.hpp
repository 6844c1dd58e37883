// bd/nn/projected_attention.hpp — multi-head attention whose four projections are linear layers
// of any kind (DenseLinear, LowRankLinear, BDLinear): the attention of a low-rank-pruned model,
// where every projection is U·Vᵀ, and of the same model with BD applied to each of them (the
// paper's "BD from low-rank"). The third projection policy of attention_layer.hpp, beside the
// dense and BD attention layers:
//
//   Q = q(x) (RoPE when rope_theta > 0),  K = k(x_kv) (RoPE),  V = v(x_kv),  y = o(O)
//
// MHA, GQA, MQA, causal or not, cross-attention and KV-cache decoding as the other layers; no
// MLA (a latent or decoupled RoPE belongs to AttentionWeights, which MultiHeadAttention holds).
#pragma once

#include <utility>

#include <Eigen/Core>

#include "bd/base/error.hpp"
#include "bd/core/scalar.hpp"
#include "bd/nn/attention_config.hpp"
#include "bd/nn/attention_layer.hpp"
#include "bd/nn/cost_model.hpp"
#include "bd/nn/decoding_cache.hpp"
#include "bd/nn/gradients.hpp"
#include "bd/nn/types.hpp"

namespace bd::nn {

template <typename Linear>
class ProjectedAttention : public AttentionLayer<ProjectedAttention<Linear>, acc_t<typename Linear::Scalar>> {
public:
  using Scalar = typename Linear::Scalar;
  using A = acc_t<Scalar>;
  using Matrix = MatrixA<A>;
  using Input = Eigen::Ref<const Matrix>;
  using Cache = KVCache<A>;

  ProjectedAttention() = default;
  /// q: d_q → n_q·d_h, k: d_kv → n_kv·d_h, v: d_kv → n_kv·d_v, o: n_q·d_v → d_out.
  ProjectedAttention(AttentionConfig config, Linear q, Linear k, Linear v, Linear o)
      : config_(std::move(config)), q_(std::move(q)), k_(std::move(k)), v_(std::move(v)), o_(std::move(o)) {
    using bd::detail::message;
    set_compute(config_.compute);  // the config's choice reaches the projections (and is checked)
    const AttentionConfig& c = config_;
    if (c.n_q <= 0 || c.n_kv <= 0 || c.n_q % c.n_kv != 0 || c.head_dim <= 0)
      throw RangeError(message("ProjectedAttention: n_q = ", c.n_q, ", n_kv = ", c.n_kv, ", head_dim = ", c.head_dim,
                               ": expected positive sizes with n_q a multiple of n_kv"));
    if (c.rope_dim != 0)
      throw RefusedError("ProjectedAttention has no decoupled RoPE (MLA): use MultiHeadAttention for an MLA layer");
    if (c.rope_theta > 0 && c.head_dim % 2) throw RangeError(message("RoPE needs an even head_dim, got ", c.head_dim));
    const Index dv = c.value_dim();
    auto require = [&](const char* name, Index got, Index expected) {
      if (got != expected) throw ShapeError(message("ProjectedAttention: ", name, " is ", got, ", expected ", expected));
    };
    require("q's output width", q_.output_dim(), c.n_q * c.head_dim);
    require("k's output width", k_.output_dim(), c.n_kv * c.head_dim);
    require("v's output width", v_.output_dim(), c.n_kv * dv);
    require("v's input width (k's)", v_.input_dim(), k_.input_dim());
    require("o's input width", o_.input_dim(), c.n_q * dv);
  }

  const AttentionConfig& config() const { return config_; }

  /// The arithmetic of the four projections (compute.hpp), set on each of them, and of the
  /// attention (AttentionConfig::compute); RangeError
  /// where the stored type cannot honour bf16 (f64, f16).
  ProjectedAttention& set_compute(Compute compute) {
    for (Linear* linear : {&q_, &k_, &v_, &o_}) linear->set_compute(compute);
    config_.compute = compute;
    return *this;
  }
  Compute compute() const { return config_.compute; }
  const Linear& q() const { return q_; }
  const Linear& k() const { return k_; }
  const Linear& v() const { return v_; }
  const Linear& o() const { return o_; }
  Index input_dim() const { return q_.input_dim(); }
  Index kv_input_dim() const { return k_.input_dim(); }
  Index output_dim() const { return o_.output_dim(); }
  Index parameters() const { return q_.parameters() + k_.parameters() + v_.parameters() + o_.parameters(); }

  /// Training: the trainable() tensors of q, k, v and o, in that order, names prefixed "q.", "k.", …
  std::vector<Parameter<Scalar>> trainable() {
    std::vector<Parameter<Scalar>> out;
    for (auto [prefix, linear] : {std::pair{"q.", &q_}, std::pair{"k.", &k_}, std::pair{"v.", &v_}, std::pair{"o.", &o_}})
      for (Parameter<Scalar>& p : linear->trainable()) out.push_back({prefix + p.name, p.value});
    return out;
  }

  /// The same attention with each projection mapped by f (e.g. LowRankLinear → BDLinear).
  template <typename F>
  auto map_projections(F&& f) const {
    using Other = std::decay_t<decltype(f(q_))>;
    return ProjectedAttention<Other>(config_, f(q_), f(k_), f(v_), f(o_));
  }

private:
  friend class AttentionLayer<ProjectedAttention<Linear>, A>;

  // The projection policy (attention_layer.hpp): each projection its linear layer.
  const AttentionWeights<Scalar>& shared_weights() const {
    static const AttentionWeights<Scalar> none;  // no latent, no query LoRA, no decoupled RoPE
    return none;
  }
  using Scratch = ScratchMatrix<A>;
  using View = Eigen::Map<Matrix>;
  View queries(const Input& xq, Index first, Scratch& out, Workspace& ws) const {
    return rotated(projected(q_, xq, out, ws), config_.n_q, first);
  }
  View keys(const Input& z, Index first, Scratch& out, Workspace& ws) const {
    return rotated(projected(k_, z, out, ws), config_.n_kv, first);
  }
  View values(const Input& z, Scratch& out, Workspace& ws) const { return projected(v_, z, out, ws); }
  Matrix output(const Input& O, Workspace& ws) const { return o_.forward(O, ws); }
  // Only MLA layers absorb (attention_layer.hpp refuses before these are reached).
  Matrix absorb_queries(const Input&, Workspace&) const { throw RefusedError("ProjectedAttention has no latent to absorb into"); }
  Matrix absorb_values(const Input&, Workspace&) const { throw RefusedError("ProjectedAttention has no latent to absorb into"); }
  AttentionShape layer_shape() const { return AttentionShape{}; }
  Mode cost_mode() const { return Mode::QKVO; }
  bool decomposed() const { return false; }

  // Backward (attention_layer.hpp): each projection's own backward, its gradients placed at its
  // tensors' slots in trainable().
  std::vector<Matrix> gradient_slots() const {
    return std::vector<Matrix>(q_.trainable_count() + k_.trainable_count() + v_.trainable_count() + o_.trainable_count());
  }
  Matrix linear_backward(const Linear& linear, std::size_t first, const Input& x, const Matrix& dY,
                         std::vector<Matrix>& g, Workspace& ws) const {
    Gradients<A> d = linear.backward(x, dY, ws);
    for (std::size_t k = 0; k < d.parameters.size(); ++k) g[first + k] = std::move(d.parameters[k]);
    return std::move(d.input);
  }
  Matrix output_backward(const Matrix& O, const Input& dy, std::vector<Matrix>& g, Workspace& ws) const {
    return linear_backward(o_, q_.trainable_count() + k_.trainable_count() + v_.trainable_count(), O, dy, g, ws);
  }
  Matrix queries_backward(const Input& xq, Matrix dQ, Index first, std::vector<Matrix>& g, Workspace& ws) const {
    if (config_.rope_theta > 0) apply_rope(dQ, config_.n_q, config_.head_dim, config_.rope_theta, config_.rope_scaling, first, true);
    return linear_backward(q_, 0, xq, dQ, g, ws);
  }
  Matrix keys_backward(const Input& z, Matrix dK, Index first, std::vector<Matrix>& g, Workspace& ws) const {
    if (config_.rope_theta > 0) apply_rope(dK, config_.n_kv, config_.head_dim, config_.rope_theta, config_.rope_scaling, first, true);
    return linear_backward(k_, q_.trainable_count(), z, dK, g, ws);
  }
  Matrix values_backward(const Input& z, const Matrix& dV, std::vector<Matrix>& g, Workspace& ws) const {
    return linear_backward(v_, q_.trainable_count() + k_.trainable_count(), z, dV, g, ws);
  }

  static View projected(const Linear& linear, const Input& x, Scratch& out, Workspace& ws) {
    View y = out.take(x.rows(), linear.output_dim());
    linear.forward_into(x, y, ws);
    return y;
  }
  View rotated(View m, Index heads, Index first) const {
    if (config_.rope_theta > 0) apply_rope(m, heads, config_.head_dim, config_.rope_theta, config_.rope_scaling, first);
    return m;
  }

  AttentionConfig config_;
  Linear q_, k_, v_, o_;
};

}  // namespace bd::nn
