// bd/nn/attention_config.hpp — the shape and weights of a multi-head attention layer.
//
// One description covers the cases bd handles (x·W orientation, weights [in, out]):
//   MHA / GQA / MQA     n_q query heads over n_kv key/value heads (n_q % n_kv == 0)
//   biases              bq, bk, bv, bo (empty = none)
//   cross-attention     forward(x, x_kv): keys and values from another input, of another width
//   RoPE                rotate_half rotary embedding on q and k (rope_theta > 0)
//   MLA (DeepSeek-V2)   keys/values from a latent c = RMSNorm(x_kv·W_dkv)·g, plus a decoupled
//                       RoPE part: per-head q_rope = x_q·Wq_rope and one k_rope = x_kv·Wk_rope
//                       shared by all heads; score = q_nope·k_nopeᵀ + q_rope·k_ropeᵀ.
//   query LoRA          queries from x_q = RMSNorm(x·W_qa)·g_q (DeepSeek-V2/V3, Kimi): Wq and
//                       Wq_rope then read the q_lora-wide x_q (x_q = x without one).
#pragma once

#include <cmath>
#include <string>

#include <Eigen/Core>

#include "bd/nn/compute.hpp"
#include "bd/base/code_size.hpp"
#include "bd/base/error.hpp"
#include "bd/base/index.hpp"
#include "bd/core/scalar.hpp"
#include "bd/core/validate.hpp"
#include "bd/nn/rope.hpp"
#include "bd/nn/types.hpp"

namespace bd::nn {

using bd::Index;

struct AttentionConfig {
  Index n_q = 1;            ///< query heads
  Index n_kv = 1;           ///< key/value heads (GQA: n_q/n_kv query heads share one)
  Index head_dim = 0;       ///< d_h of q and k (the no-RoPE part for MLA)
  Index v_head_dim = 0;     ///< d_h of v (0: same as head_dim)
  bool causal = false;      ///< mask keys after the query's position
  double rope_theta = 0;    ///< > 0: vanilla RoPE (rotate_half) on q and k
  Index rope_dim = 0;       ///< > 0: decoupled RoPE channels per head (MLA)
  double rope_dim_theta = 10000;  ///< θ of the decoupled RoPE channels
  RopeScaling rope_scaling; ///< the RoPE scheme (rope.hpp) of whichever RoPE the layer has
  double scale = 0;         ///< softmax scale; 0: 1/sqrt(head_dim + rope_dim)
  double norm_eps = 1e-6;   ///< RMSNorm epsilon of the latent (MLA)
  /// > 0: the model masks keys more than this many positions back (Mistral's sliding window).
  /// bd does not implement that mask: a call that would reach past the window is refused.
  Index sliding_window = 0;
  /// The arithmetic of the layer's products (compute.hpp): f32, or bf16 — the projections' and
  /// the attention's (QKᵀ, P·V) operands rounded once to bfloat16, products summed in f32.
  /// Softmax, norms and RoPE stay f32, and so does decoding's few-row attention (bound by reading
  /// the cache). Not read from a model's config: set_compute().
  Compute compute = Compute::F32;

  Index value_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
  Index group() const { return n_q / n_kv; }
  double softmax_scale() const { return scale > 0 ? scale : 1.0 / std::sqrt(double(head_dim + rope_dim)); }
};

/// Weights stored in S. Empty matrices/vectors mean "absent".
template <typename S>
struct AttentionWeights {
  using Matrix = StoredMatrix<S>;
  using Vector = StoredVector<S>;
  Matrix Wq;        ///< d_q × n_q·d_h
  Matrix Wk;        ///< d_kv × n_kv·d_h
  Matrix Wv;        ///< d_kv × n_kv·d_v
  Matrix Wo;        ///< n_q·d_v × d_out
  Vector bq, bk, bv, bo;
  Matrix W_dkv;     ///< MLA: d_model_kv × d_kv, the latent projection (keys/values read c)
  Vector kv_norm;   ///< MLA: RMSNorm gain of the latent (empty: no norm)
  Matrix Wq_rope;   ///< MLA: d_q × n_q·rope_dim
  Matrix Wk_rope;   ///< MLA: d_model_kv × rope_dim (one key RoPE part for all heads)
  Matrix W_qa;      ///< query LoRA: d_model × q_lora (Wq, Wq_rope then have q_lora rows)
  Vector q_norm;    ///< query LoRA: RMSNorm gain of x·W_qa (empty: no norm)

  /// The same weights rounded once to T.
  template <typename T>
  AttentionWeights<T> cast() const {
    AttentionWeights<T> out;
    auto c = [](const auto& m) { return round_matrix<T>(m.template cast<double>()); };
    auto v = [](const Vector& m) -> typename AttentionWeights<T>::Vector { return round_matrix<T>(m.template cast<double>()); };
    out.Wq = c(Wq); out.Wk = c(Wk); out.Wv = c(Wv); out.Wo = c(Wo);
    out.bq = v(bq); out.bk = v(bk); out.bv = v(bv); out.bo = v(bo);
    out.W_dkv = c(W_dkv); out.kv_norm = v(kv_norm); out.Wq_rope = c(Wq_rope); out.Wk_rope = c(Wk_rope);
    out.W_qa = c(W_qa); out.q_norm = v(q_norm);
    return out;
  }
};

namespace detail {

using bd::detail::message;
using bd::detail::require_finite;
using bd::detail::require_nonempty;

template <typename M>
void require_shape(const M& m, Index rows, Index cols, const std::string& name) {
  if (m.rows() != rows || m.cols() != cols)
    throw ShapeError(message(name, " is ", m.rows(), "x", m.cols(), ", expected ", rows, "x", cols));
}

template <typename V>
void require_bias(const V& b, Index size, const std::string& name) {
  if (b.size() != 0 && b.size() != size)
    throw ShapeError(message(name, " has ", b.size(), " entries, expected ", size, " (or none)"));
}

/// Checks that config and weights describe one consistent layer; names what disagrees.
template <typename S>
BD_COLD void validate_attention(const AttentionConfig& c, const AttentionWeights<S>& w) {
  require_compute<S>(c.compute, "attention");
  if (c.n_q <= 0 || c.n_kv <= 0 || c.n_q % c.n_kv != 0)
    throw RangeError(message("attention heads: n_q = ", c.n_q, ", n_kv = ", c.n_kv,
                             ": expected positive counts with n_q a multiple of n_kv"));
  if (c.head_dim <= 0) throw RangeError(message("head_dim is ", c.head_dim, ": expected a positive head size"));
  if (c.rope_theta > 0 && c.head_dim % 2)
    throw RangeError(message("RoPE needs an even head_dim, got ", c.head_dim));
  if (c.rope_dim < 0 || c.rope_dim % 2)
    throw RangeError(message("rope_dim is ", c.rope_dim, ": expected 0 or an even number of decoupled RoPE channels"));
  c.rope_scaling.validate();
  const Index dv = c.value_dim();
  require_nonempty(w.Wq, "Wq");
  require_nonempty(w.Wk, "Wk");
  const Index d_q = w.Wq.rows(), d_kv = w.Wk.rows();
  require_shape(w.Wq, d_q, c.n_q * c.head_dim, "Wq");
  require_shape(w.Wk, d_kv, c.n_kv * c.head_dim, "Wk");
  require_shape(w.Wv, d_kv, c.n_kv * dv, "Wv");
  if (w.Wo.rows() != c.n_q * dv || w.Wo.cols() == 0)
    throw ShapeError(message("Wo is ", w.Wo.rows(), "x", w.Wo.cols(), ", expected ", c.n_q * dv, " rows (n_q·d_v)"));
  require_bias(w.bq, c.n_q * c.head_dim, "bq");
  require_bias(w.bk, c.n_kv * c.head_dim, "bk");
  require_bias(w.bv, c.n_kv * dv, "bv");
  require_bias(w.bo, w.Wo.cols(), "bo");
  if (w.W_dkv.size() && w.W_dkv.cols() != d_kv)
    throw ShapeError(message("W_dkv is ", w.W_dkv.rows(), "x", w.W_dkv.cols(), ", expected ", d_kv,
                             " columns (the latent width that Wk and Wv read)"));
  require_bias(w.kv_norm, w.W_dkv.size() ? d_kv : 0, "kv_norm");
  if (c.rope_dim > 0) {
    require_shape(w.Wq_rope, d_q, c.n_q * c.rope_dim, "Wq_rope");
    const Index d_model_kv = w.W_dkv.size() ? w.W_dkv.rows() : d_kv;
    require_shape(w.Wk_rope, d_model_kv, c.rope_dim, "Wk_rope");
  } else if (w.Wq_rope.size() || w.Wk_rope.size()) {
    throw ShapeError("Wq_rope/Wk_rope are set but rope_dim is 0");
  }
  if (w.W_qa.size() && w.W_qa.cols() != d_q)
    throw ShapeError(message("W_qa is ", w.W_qa.rows(), "x", w.W_qa.cols(), ", expected ", d_q,
                             " columns (the query LoRA width that Wq reads)"));
  require_bias(w.q_norm, w.W_qa.size() ? d_q : 0, "q_norm");
  for (const auto* m : {&w.Wq, &w.Wk, &w.Wv, &w.Wo, &w.W_dkv, &w.Wq_rope, &w.Wk_rope, &w.W_qa})
    require_finite(*m, "an attention weight");
  for (const auto* b : {&w.bq, &w.bk, &w.bv, &w.bo, &w.kv_norm, &w.q_norm}) require_finite(*b, "an attention bias");
}

}  // namespace detail
}  // namespace bd::nn
