// bd/nn/llama.hpp — a LLaMA-architecture decoder (RMSNorm, RoPE attention with GQA, SwiGLU
// MLP), with the attention layer as a template parameter: the dense MultiHeadAttention or BD's
// BDAttention. Weights are stored in S, arithmetic runs in acc_t<S>; every product is on the
// dispatched kernel (attention through attention_layer.hpp, the MLP and the head through
// detail::project).
//
//   h = E[tokens];  h += attn(rms(h)·g₁);  h += W_down·(silu(W_gate·x) ⊙ W_up·x), x = rms(h)·g₂
//   logits = rms(h)·g_f · W_lm
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "bd/core/error.hpp"
#include "bd/core/scalar.hpp"
#include "bd/nn/attention_core.hpp"
#include "bd/nn/attention_steps.hpp"
#include "bd/nn/bd_attention.hpp"
#include "bd/nn/multi_head_attention.hpp"

namespace bd::nn {

struct LlamaConfig {
  Index hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0, vocab = 0, head_dim = 0;
  double rms_eps = 1e-5, rope_theta = 10000;
};

template <typename S, typename Attention>
struct LlamaLayer {
  using Stored = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>;
  using StoredVector = Eigen::Matrix<S, Eigen::Dynamic, 1>;
  StoredVector attn_norm, mlp_norm;
  Attention attention;
  Stored gate, up, down;  ///< x·W orientation: d × ff, d × ff, ff × d
};

template <typename S, typename Attention = MultiHeadAttention<S>>
class LlamaModel {
public:
  using Scalar = S;
  using A = acc_t<S>;
  using Matrix = MatrixA<A>;
  using Stored = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>;
  using StoredVector = Eigen::Matrix<S, Eigen::Dynamic, 1>;
  using Layer = LlamaLayer<S, Attention>;

  LlamaConfig config;
  Stored embedding;  ///< vocab × d
  Stored lm_head;    ///< d × vocab
  StoredVector final_norm;
  std::vector<Layer> layers;

  /// Logits (L × vocab) of a token sequence, causal.
  Matrix logits(const std::vector<int>& tokens) const {
    Matrix h(static_cast<Index>(tokens.size()), config.hidden);
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] < 0 || tokens[i] >= config.vocab)
        throw RangeError(bd::detail::message("token ", tokens[i], " at position ", i, " is outside the vocabulary of ",
                                             config.vocab));
      h.row(static_cast<Index>(i)) = embedding.row(tokens[i]).template cast<A>();
    }
    for (const Layer& layer : layers) {
      h += layer.attention.forward(norm(h, layer.attn_norm));
      const Matrix x = norm(h, layer.mlp_norm);
      const Matrix gate = detail::project<A, S>(x, layer.gate);
      const Matrix up = detail::project<A, S>(x, layer.up);
      const Matrix act = (gate.array() / (A(1) + (-gate.array()).exp()) * up.array()).matrix();  // silu(g)·u
      h += detail::project<A, S>(act, layer.down);
    }
    return detail::project<A, S>(norm(h, final_norm), lm_head);
  }

  /// The same model with every weight rounded once to T (attention stays dense).
  template <typename T>
  LlamaModel<T> cast() const {
    return convert<T, MultiHeadAttention<T>>([](const Attention& a) { return a.template cast<T>(); });
  }

  /// The model with BD attention in every layer, prepared in double from this model's weights;
  /// everything is stored in T (the other weights rounded once).
  template <typename T>
  LlamaModel<T, BDAttention<T>> with_bd_attention(const BDAttentionOptions& opts) const {
    return convert<T, BDAttention<T>>([&](const Attention& a) { return BDAttention<T>::prepare(a, opts); });
  }

private:
  Matrix norm(const Matrix& h, const StoredVector& gain) const {
    return rms_norm<A>(h, gain.template cast<A>(), config.rms_eps);
  }

  template <typename T, typename OtherAttention, typename MakeAttention>
  LlamaModel<T, OtherAttention> convert(MakeAttention&& make) const {
    auto r = [](const auto& m) { return round_matrix<T>(m.template cast<double>()); };
    LlamaModel<T, OtherAttention> out;
    out.config = config;
    out.embedding = r(embedding);
    out.lm_head = r(lm_head);
    out.final_norm = r(final_norm);
    for (const Layer& l : layers) {
      LlamaLayer<T, OtherAttention> layer{r(l.attn_norm), r(l.mlp_norm), make(l.attention), r(l.gate), r(l.up), r(l.down)};
      out.layers.push_back(std::move(layer));
    }
    return out;
  }
};

}  // namespace bd::nn
