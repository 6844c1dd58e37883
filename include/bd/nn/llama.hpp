// bd/nn/llama.hpp — a LLaMA-architecture decoder (RMSNorm, RoPE attention with GQA, SwiGLU
// MLP), with the attention layer and the MLP's linear layers as template parameters: the dense
// MultiHeadAttention or BD's BDAttention with dense MLPs (a pretrained model), or a low-rank-
// pruned model (ProjectedAttention<LowRankLinear>, LowRankLinear) and its BD form (BDLinear
// everywhere). Weights are stored in S, arithmetic runs in acc_t<S>; every product is on the
// dispatched kernel (attention through attention_layer.hpp, the linear layers, the head
// through detail::project). Decoding keeps a KV cache per layer.
//
//   h = E[tokens];  h += attn(rms(h)·g₁);  h += W_down·(silu(W_gate·x) ⊙ W_up·x), x = rms(h)·g₂
//   logits = rms(h)·g_f · W_lm
#pragma once

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "bd/base/error.hpp"
#include "bd/core/scalar.hpp"
#include "bd/nn/attention_steps.hpp"
#include "bd/nn/bd_attention.hpp"
#include "bd/nn/bd_linear.hpp"
#include "bd/nn/decoding_cache.hpp"
#include "bd/nn/dense_linear.hpp"
#include "bd/nn/low_rank_linear.hpp"
#include "bd/nn/multi_head_attention.hpp"
#include "bd/nn/projected_attention.hpp"
#include "bd/nn/rms_norm.hpp"
#include "bd/nn/types.hpp"

namespace bd::nn {

struct LlamaConfig {
  Index hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0, vocab = 0, head_dim = 0;
  double rms_eps = 1e-5, rope_theta = 10000;
  RopeScaling rope_scaling;   ///< the RoPE scheme (rope.hpp)
  Index sliding_window = 0;   ///< > 0: keys further back than this are masked (refused when reached)
};

template <typename S, typename Attention = MultiHeadAttention<S>, typename Linear = DenseLinear<S>>
struct LlamaLayer {
  using StoredVector = nn::StoredVector<S>;
  StoredVector attn_norm, mlp_norm;
  Attention attention;
  Linear gate, up, down;  ///< d → ff, d → ff, ff → d
};

/// A LLaMA decoder. Attention: MultiHeadAttention, BDAttention or ProjectedAttention<Linear>;
/// Linear, the MLP's layers: DenseLinear, LowRankLinear or BDLinear.
template <typename S, typename Attention = MultiHeadAttention<S>, typename Linear = DenseLinear<S>>
class LlamaModel {
public:
  using Scalar = S;
  using A = acc_t<S>;
  using Matrix = MatrixA<A>;
  using Stored = StoredMatrix<S>;
  using StoredVector = nn::StoredVector<S>;
  using Layer = LlamaLayer<S, Attention, Linear>;

  /// Every layer's keys and values of the tokens decoded so far.
  class Cache {
  public:
    Index length() const { return layers_.empty() ? 0 : layers_.front().length(); }
    /// Forgets every token after the first `length` (a rejected draft; a benchmark at a fixed context).
    void truncate(Index length) {
      for (KVCache<A>& c : layers_) c.truncate(length);
    }

  private:
    friend class LlamaModel;
    std::vector<KVCache<A>> layers_;
  };

  LlamaConfig config;
  Stored embedding;  ///< vocab × d
  Stored lm_head;    ///< d × vocab
  StoredVector final_norm;
  std::vector<Layer> layers;

  /// Logits (L × vocab) of a token sequence, causal.
  /// (Every call runs its kernels with the buffers of `ws`: nn/types.hpp.)
  Matrix logits(const std::vector<int>& tokens, Workspace& ws = default_workspace()) const { return run(tokens, nullptr, ws); }

  /// Decoding: the logits of `tokens` (L × vocab) following the cache's tokens, whose keys and
  /// values the cache gains. Equal to the last L rows of logits() over the whole sequence.
  Matrix decode(const std::vector<int>& tokens, Cache& cache, Workspace& ws = default_workspace()) const {
    return run(tokens, &cache, ws);
  }

  /// The arithmetic of every product (compute.hpp): each layer's attention and MLP and the
  /// head. RangeError where the stored type cannot honour bf16 (f64, f16). Models made from this
  /// one (cast, with_bd_attention, with_bd_linear) compute as it does.
  LlamaModel& set_compute(Compute compute) {
    detail::require_compute<S>(compute, "LlamaModel");
    for (Layer& l : layers) {
      l.attention.set_compute(compute);
      for (Linear* linear : {&l.gate, &l.up, &l.down}) linear->set_compute(compute);
    }
    compute_ = compute;
    return *this;
  }
  Compute compute() const { return compute_; }

  /// Parameters of the decoder layers (attention and MLP; no norms, embedding or head).
  Index layer_parameters() const {
    Index n = 0;
    for (const Layer& l : layers) n += l.attention.parameters() + l.gate.parameters() + l.up.parameters() +
                                       l.down.parameters();
    return n;
  }

  /// The same model with every weight rounded once to T (attention stays dense).
  template <typename T>
  LlamaModel<T> cast() const {
    return convert<T, MultiHeadAttention<T>, DenseLinear<T>>([](const Attention& a) { return a.template cast<T>(); },
                                                             rounded_linear<T>);
  }

  /// The model with BD attention in every layer, prepared in double from this model's weights;
  /// everything is stored in T (the other weights rounded once).
  template <typename T>
  LlamaModel<T, BDAttention<T>> with_bd_attention(const BDAttentionOptions& opts) const {
    return convert<T, BDAttention<T>, DenseLinear<T>>([&](const Attention& a) { return BDAttention<T>::prepare(a, opts); },
                                                      rounded_linear<T>);
  }

  /// A low-rank model (ProjectedAttention<LowRankLinear>, LowRankLinear MLP) with every linear
  /// layer replaced by its BD form (BDLinear::from_low_rank): the same function, r² fewer
  /// parameters and multiply-adds per layer and token.
  LlamaModel<S, ProjectedAttention<BDLinear<S>>, BDLinear<S>> with_bd_linear(const bd::Options& opts = {}) const {
    static_assert(std::is_same_v<Linear, LowRankLinear<S>> && std::is_same_v<Attention, ProjectedAttention<LowRankLinear<S>>>,
                  "with_bd_linear: a model whose every linear layer is a LowRankLinear");
    const auto to_bd = [&](const LowRankLinear<S>& l) { return BDLinear<S>::from_low_rank(l, opts); };
    return convert<S, ProjectedAttention<BDLinear<S>>, BDLinear<S>>(
        [&](const Attention& a) { return a.map_projections(to_bd); }, to_bd);
  }

private:
  Matrix run(const std::vector<int>& tokens, Cache* cache, Workspace& ws) const;

  Matrix norm(const Matrix& h, const StoredVector& gain) const {
    return rms_norm<A>(h, gain.template cast<A>(), config.rms_eps);
  }

  template <typename T>
  static auto round_stored(const StoredMatrix<S>& m) {
    return round_matrix<T>(m.template cast<double>());
  }
  template <typename T>
  static Eigen::Matrix<T, Eigen::Dynamic, 1> round_stored(const StoredVector& v) {
    return round_matrix<T>(v.template cast<double>());
  }
  template <typename T>
  static DenseLinear<T> rounded_linear(const Linear& l) {
    static_assert(std::is_same_v<Linear, DenseLinear<S>>, "rounding a model's MLP: dense linear layers");
    return DenseLinear<T>(round_stored<T>(l.weight()), round_stored<T>(l.bias()));
  }
  template <typename T, typename OtherAttention, typename OtherLinear, typename MakeAttention, typename MakeLinear>
  LlamaModel<T, OtherAttention, OtherLinear> convert(MakeAttention&& make, MakeLinear&& linear) const {
    LlamaModel<T, OtherAttention, OtherLinear> out;
    out.config = config;
    out.embedding = round_stored<T>(embedding);
    out.lm_head = round_stored<T>(lm_head);
    out.final_norm = round_stored<T>(final_norm);
    for (const Layer& l : layers)
      out.layers.push_back({round_stored<T>(l.attn_norm), round_stored<T>(l.mlp_norm), make(l.attention), linear(l.gate),
                            linear(l.up), linear(l.down)});
    out.set_compute(compute_);
    return out;
  }

  Compute compute_ = Compute::F32;
};

// run(), defined out of the class so that bd::compiled can hold it (a member defined in its class
// is implicitly inline and compiled in every caller): the models the loaders build, dense and
// with BD attention, for every stored type (src/compiled_nn.cpp).
template <typename S, typename Attention, typename Linear>
auto LlamaModel<S, Attention, Linear>::run(const std::vector<int>& tokens, Cache* cache, Workspace& ws) const -> Matrix {
  Matrix h(static_cast<Index>(tokens.size()), config.hidden);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config.vocab)
      throw RangeError(bd::detail::message("token ", tokens[i], " at position ", i, " is outside the vocabulary of ",
                                           config.vocab));
    h.row(static_cast<Index>(i)) = embedding.row(tokens[i]).template cast<A>();
  }
  if (cache && cache->layers_.empty()) cache->layers_.resize(layers.size());
  if (cache && cache->layers_.size() != layers.size())
    throw ShapeError(bd::detail::message("LlamaModel::decode: the cache holds ", cache->layers_.size(),
                                         " layers, the model has ", layers.size()));
  Matrix x, gate, up;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const Layer& layer = layers[l];
    x = norm(h, layer.attn_norm);
    h += cache ? layer.attention.decode(x, cache->layers_[l], ws) : layer.attention.forward(x, ws);
    x = norm(h, layer.mlp_norm);
    gate.resize(x.rows(), layer.gate.output_dim());
    up.resize(x.rows(), layer.up.output_dim());
    layer.gate.forward_into(x, gate, ws);
    layer.up.forward_into(x, up, ws);
    gate = (gate.array() / (A(1) + (-gate.array()).exp()) * up.array()).matrix();  // silu(g)·u
    h += layer.down.forward(gate, ws);
  }
  return detail::project<A, S>(norm(h, final_norm), lm_head, {}, ws, compute_);
}

#define BD_LLAMA_MODEL_RUN(prefix, S, Attention)                                                                       \
  prefix MatrixA<acc_t<S>> LlamaModel<S, Attention, DenseLinear<S>>::run(                                             \
      const std::vector<int>&, LlamaModel<S, Attention, DenseLinear<S>>::Cache*, Workspace&) const;
#define BD_LLAMA_MODEL_INSTANTIATIONS(prefix)                                                       \
  BD_LLAMA_MODEL_RUN(prefix, float, MultiHeadAttention<float>)                                      \
  BD_LLAMA_MODEL_RUN(prefix, double, MultiHeadAttention<double>)                                    \
  BD_LLAMA_MODEL_RUN(prefix, Eigen::half, MultiHeadAttention<Eigen::half>)                          \
  BD_LLAMA_MODEL_RUN(prefix, Eigen::bfloat16, MultiHeadAttention<Eigen::bfloat16>)                  \
  BD_LLAMA_MODEL_RUN(prefix, float, BDAttention<float>)                                             \
  BD_LLAMA_MODEL_RUN(prefix, double, BDAttention<double>)                                           \
  BD_LLAMA_MODEL_RUN(prefix, Eigen::half, BDAttention<Eigen::half>)                                 \
  BD_LLAMA_MODEL_RUN(prefix, Eigen::bfloat16, BDAttention<Eigen::bfloat16>)
#if defined(BD_COMPILED_LIB)
BD_LLAMA_MODEL_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::nn
