// bd/train/language_model.hpp — a decoder-only Transformer language model, trainable with
// either attention: MHA (nn::MultiHeadAttention) or BDA (nn::BDAttention, whose basis and
// coefficients are the learnable parameters: the paper's §5.2). Positions are added at the
// embedding (sinusoidal), so attention has no RoPE and BD is exact on QK and VO.
//
//   x = embed(tokens);  for each block:  x += attention(RMSNorm(x));  x += FFN(RMSNorm(x))
//   logits = RMSNorm(x)·W_head;   loss = mean cross-entropy of each next token
//
// BDA starts either as its own architecture — the basis and coefficients drawn directly, as a
// training script that swaps MHA for BDA would (the constructor; bda_layer below derives the
// scales) — or as the BD of an MHA model (to_bd()), which computes the MHA model's function.
// The model's tensors are registered once, in a fixed order, in one ParameterSet;
// the model can be moved, not copied (the set views its tensors in place).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "bd/base/error.hpp"
#include "bd/io/safetensors.hpp"
#include "bd/io/safetensors_writer.hpp"
#include "bd/nn/bd_attention.hpp"
#include "bd/nn/dense_linear.hpp"
#include "bd/nn/multi_head_attention.hpp"
#include "bd/train/layers.hpp"
#include "bd/train/parameters.hpp"

namespace bd::train {

struct ModelConfig {
  Index vocab = 256;   ///< bytes
  Index dim = 128;     ///< d
  Index heads = 4;     ///< d_h = d / heads (1/4 of d with 4 heads, as the paper's model)
  Index layers = 2;
  Index ffn = 256;     ///< the feed-forward block's hidden width
  Index context = 128; ///< tokens per sequence

  void validate() const {
    if (vocab <= 0 || dim <= 0 || heads <= 0 || layers <= 0 || ffn <= 0 || context <= 0 || dim % heads)
      throw RangeError(bd::detail::message("model config: vocab ", vocab, ", dim ", dim, ", heads ", heads, ", layers ", layers,
                                           ", ffn ", ffn, ", context ", context,
                                           ": expected positive sizes with dim a multiple of heads"));
  }
};

/// A BDA layer drawn as its own architecture (QK and VO decomposed, every head's window on the
/// first d_h of the d input channels, as the paper's BDA), for inputs whose entries have variance
/// v (RMSNorm's output: v ≈ 1). The scales give the layer MHA's statistics at the start
/// (docs/training.md, "BDA's own initialisation"): a Glorot-uniform projection W (d × d,
/// Var W_ij = 1/d) gives x·W entries of variance v; C's entries uniform with Var = 1/(d − d_h) give
/// x[:, R]·C_h that same variance, so K'_h = x[:, S] + x[:, R]·C_h and V'_h have 2v; B_qk and B_vo
/// Glorot-uniform scaled by 1/√2 then give each score q'·k' (d_h terms of (v/2)·(2v)) and each
/// output O'·B_vo the variances MHA's q·k (d_h terms of v·v) and O·Wo have.
template <typename T>
nn::BDAttention<T> bda_layer(const nn::AttentionConfig& ac, Index d, std::mt19937_64& rng) {
  const Index n = ac.n_q, dh = ac.head_dim, rest = d - dh;
  const double coeff_bound = rest > 0 ? std::sqrt(3.0 / double(rest)) : 0.0;  // uniform(−a, a): Var = a²/3
  nn::BDWeights<T> w;
  w.qk_basis = glorot<T>(d, n * dh, rng) / T(std::sqrt(2.0));
  w.qk_coeff = uniform<T>(rest, n * dh, coeff_bound, rng);
  w.qk_indices = nn::HeadIndices::window(d, dh, 0, n);
  w.vo_coeff = uniform<T>(rest, n * dh, coeff_bound, rng);
  w.vo_basis = glorot<T>(n * dh, d, rng) / T(std::sqrt(2.0));
  w.vo_indices = nn::HeadIndices::window(d, dh, 0, n);
  return nn::BDAttention<T>::assemble(ac, nn::Mode::QKVO, nn::AttentionWeights<T>{}, std::move(w));
}

template <typename Attention>
class LanguageModel {
public:
  using T = typename Attention::Scalar;
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "training runs in float or double");

  /// A freshly initialised model, every draw from `seed`: MHA with Glorot-uniform Wq, Wk, Wv and
  /// Wo; BDA as its own architecture (bda_layer: the paper's first-rows windows, B and C drawn).
  LanguageModel(const ModelConfig& c, std::uint64_t seed) : config_(c) {
    static_assert(std::is_same_v<Attention, nn::MultiHeadAttention<T>> || std::is_same_v<Attention, nn::BDAttention<T>>,
                  "a language model with MultiHeadAttention or BDAttention");
    c.validate();
    std::mt19937_64 rng(seed);
    embed_ = Embedding<T>(c.vocab, c.dim, rng);
    nn::AttentionConfig ac;
    ac.n_q = ac.n_kv = c.heads;
    ac.head_dim = c.dim / c.heads;
    ac.causal = true;
    for (Index l = 0; l < c.layers; ++l) {
      Attention attention = [&] {
        if constexpr (std::is_same_v<Attention, nn::BDAttention<T>>) {
          return bda_layer<T>(ac, c.dim, rng);
        } else {
          nn::AttentionWeights<T> w;
          w.Wq = glorot<T>(c.dim, c.dim, rng), w.Wk = glorot<T>(c.dim, c.dim, rng);
          w.Wv = glorot<T>(c.dim, c.dim, rng), w.Wo = glorot<T>(c.dim, c.dim, rng);
          return Attention(ac, std::move(w));
        }
      }();
      blocks_.push_back({RMSNorm<T>(c.dim), std::move(attention), RMSNorm<T>(c.dim), FeedForward<T>(c.dim, c.ffn, rng)});
    }
    final_ = RMSNorm<T>(c.dim);
    head_ = nn::DenseLinear<T>(glorot<T>(c.dim, c.vocab, rng));
    register_parameters();
  }

  LanguageModel(const LanguageModel&) = delete;
  LanguageModel& operator=(const LanguageModel&) = delete;
  LanguageModel(LanguageModel&& other) noexcept = default;  // the tensors' buffers move with it
  LanguageModel& operator=(LanguageModel&&) = delete;

  /// The same function with every attention layer basis-decomposed (QK and VO, the given basis
  /// strategy), prepared in double from this model's weights.
  LanguageModel<nn::BDAttention<T>> to_bd(const nn::BDAttentionOptions& opts) const {
    std::vector<typename LanguageModel<nn::BDAttention<T>>::Block> blocks;
    for (const Block& b : blocks_)
      blocks.push_back({b.norm1, nn::BDAttention<T>::prepare(b.attention, opts), b.norm2, b.ffn});
    return LanguageModel<nn::BDAttention<T>>(config_, embed_, std::move(blocks), final_, head_);
  }

  const ModelConfig& config() const { return config_; }
  ParameterSet<T>& parameters() { return params_; }
  Index parameter_count() const { return params_.size(); }
  /// Trainable values in the attention layers alone (what BD changes).
  Index attention_parameter_count() const {
    Index n = 0;
    for (std::size_t b = 0; b < blocks_.size(); ++b)
      for (std::size_t i = attention_first_[b]; i < attention_first_[b] + attention_count_[b]; ++i) n += params_[i].value.size();
    return n;
  }

  /// Mean next-token loss over windows of context + 1 tokens each (stacked): token t of a window
  /// predicts token t + 1.
  /// Its kernels keep their buffers in `ws` (the process's default_workspace() when omitted).
  double loss(const std::vector<int>& windows, Workspace& ws = default_workspace()) const {
    return run(windows, nullptr, ws);
  }

  /// The same loss, with its gradient added to parameters().gradient().
  double loss_and_gradient(const std::vector<int>& windows, Workspace& ws = default_workspace()) {
    return run(windows, &params_, ws);
  }

  /// Every trainable tensor into a safetensors file (atomically), by its name.
  void save(const std::string& path) const {
    io::Writer w;
    for (std::size_t i = 0; i < params_.count(); ++i) w.add<T>(params_[i].name, params_[i].value);
    w.set_metadata("bd.train.attention", std::is_same_v<Attention, nn::BDAttention<T>> ? "bda" : "mha");
    w.write(path);
  }

  /// Values from a file save() wrote for a model of this structure (every name and shape checked).
  void load(const std::string& path) {
    const auto st = io::SafeTensors::open(path);
    for (std::size_t i = 0; i < params_.count(); ++i) {
      const auto m = st.matrix<T>(params_[i].name);
      if (m.rows() != params_[i].value.rows() || m.cols() != params_[i].value.cols())
        throw FormatError(bd::detail::message(path, ": ", params_[i].name, " is ", m.rows(), "x", m.cols(), ", the model's ",
                                              params_[i].value.rows(), "x", params_[i].value.cols()));
      params_[i].value = m;
    }
  }

private:
  template <typename>
  friend class LanguageModel;

  struct Block {
    RMSNorm<T> norm1;
    Attention attention;
    RMSNorm<T> norm2;
    FeedForward<T> ffn;
  };

  LanguageModel(const ModelConfig& c, Embedding<T> embed, std::vector<Block> blocks, RMSNorm<T> final_norm, nn::DenseLinear<T> head)
      : config_(c), embed_(std::move(embed)), blocks_(std::move(blocks)), final_(std::move(final_norm)), head_(std::move(head)) {
    register_parameters();
  }

  void register_parameters() {
    embed_first_ = params_.add("embed.", embed_.trainable());
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      const std::string p = "blocks." + std::to_string(b) + ".";
      Block& block = blocks_[b];
      norm1_first_.push_back(params_.add(p + "norm1.", block.norm1.trainable()));
      const auto attention = block.attention.trainable();
      attention_first_.push_back(params_.add(p + "attention.", attention));
      attention_count_.push_back(attention.size());
      norm2_first_.push_back(params_.add(p + "norm2.", block.norm2.trainable()));
      ffn_first_.push_back(params_.add(p + "ffn.", block.ffn.trainable()));
    }
    final_first_ = params_.add("final_norm.", final_.trainable());
    head_first_ = params_.add("head.", head_.trainable());
  }

  /// Forward over the windows; with `grad`, the backward too, accumulated into it.
  double run(const std::vector<int>& windows, ParameterSet<T>* grad, Workspace& ws) const {
    const Index L = config_.context, W = L + 1;
    if (windows.empty() || Index(windows.size()) % W)
      throw ShapeError(bd::detail::message("LanguageModel: ", windows.size(), " tokens are not whole windows of ", W));
    const Index count = Index(windows.size()) / W;
    std::vector<int> inputs, targets;
    for (Index s = 0; s < count; ++s) {
      inputs.insert(inputs.end(), windows.begin() + s * W, windows.begin() + s * W + L);
      targets.insert(targets.end(), windows.begin() + s * W + 1, windows.begin() + (s + 1) * W);
    }
    struct Saved {
      Matrix<T> x, n1, mid, n2;
    };
    std::vector<Saved> saved(blocks_.size());
    Matrix<T> x = embed_.forward(inputs, L);
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      const Block& block = blocks_[b];
      Saved& s = saved[b];
      s.x = x;
      s.n1 = block.norm1.forward(x);
      for (Index q = 0; q < count; ++q) x.middleRows(q * L, L) += block.attention.forward(s.n1.middleRows(q * L, L), ws);
      s.mid = x;
      s.n2 = block.norm2.forward(x);
      x += block.ffn.forward(s.n2, ws);
    }
    const Matrix<T> normed = final_.forward(x);
    const Matrix<T> logits = head_.forward(normed, ws);
    Matrix<T> d_logits;
    const double loss = cross_entropy(logits, targets, grad ? &d_logits : nullptr);
    if (!grad) return loss;

    nn::Gradients<T> head = head_.backward(normed, d_logits, ws);
    grad->accumulate(head_first_, head.parameters);
    nn::Gradients<T> fin = final_.backward(x, head.input);
    grad->accumulate(final_first_, fin.parameters);
    Matrix<T> dx = std::move(fin.input);
    for (std::size_t b = blocks_.size(); b-- > 0;) {
      const Block& block = blocks_[b];
      const Saved& s = saved[b];
      nn::Gradients<T> ffn = block.ffn.backward(s.n2, dx, ws);
      grad->accumulate(ffn_first_[b], ffn.parameters);
      nn::Gradients<T> n2 = block.norm2.backward(s.mid, ffn.input);
      grad->accumulate(norm2_first_[b], n2.parameters);
      dx += n2.input;  // ∂ at the block's middle
      Matrix<T> d_n1(dx.rows(), dx.cols());
      for (Index q = 0; q < count; ++q) {
        nn::Gradients<T> a = block.attention.backward(s.n1.middleRows(q * L, L), dx.middleRows(q * L, L), ws);
        grad->accumulate(attention_first_[b], a.parameters);
        d_n1.middleRows(q * L, L) = a.input;
      }
      nn::Gradients<T> n1 = block.norm1.backward(s.x, d_n1);
      grad->accumulate(norm1_first_[b], n1.parameters);
      dx += n1.input;
    }
    grad->accumulate(embed_first_, embed_.backward(inputs, dx));
    return loss;
  }

  ModelConfig config_;
  Embedding<T> embed_;
  std::vector<Block> blocks_;
  RMSNorm<T> final_;
  nn::DenseLinear<T> head_;
  ParameterSet<T> params_;
  std::size_t embed_first_ = 0, final_first_ = 0, head_first_ = 0;
  std::vector<std::size_t> norm1_first_, attention_first_, attention_count_, norm2_first_, ffn_first_;
};

}  // namespace bd::train
