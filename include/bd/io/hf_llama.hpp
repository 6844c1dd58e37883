// bd/io/hf_llama.hpp — loads a Hugging Face LLaMA folder (config.json and model.safetensors, or
// shards with model.safetensors.index.json) into bd::nn::LlamaModel. The attention layers come
// from the checkpoint layouts (bd/io/checkpoint.hpp), the rest by the names below; HF stores
// linear weights [out, in] and bd uses x·W, so they are transposed on load. Every tensor's
// presence, dtype and shape is checked against config.json.
#pragma once

#include <string>

#include "bd/core/scalar.hpp"
#include "bd/io/checkpoint.hpp"
#include "bd/io/model_folder.hpp"
#include "bd/nn/llama.hpp"

namespace bd::io {

namespace detail {

/// Everything of a LLaMA model but its attention layers, which `attention(l)` supplies.
template <typename S, typename Attention, typename MakeAttention>
nn::LlamaModel<S, Attention> llama_model(const ModelFolder& m, MakeAttention attention) {
  const nn::LlamaConfig c = llama_config(m.config(), m.config_path());
  auto stored = [](const Eigen::MatrixXd& w) { return round_matrix<S>(w); };
  auto vec = [&](const std::string& name, Eigen::Index n) -> Eigen::Matrix<S, Eigen::Dynamic, 1> {
    return stored(m.matrix(name, n, 1));
  };
  nn::LlamaModel<S, Attention> model;
  model.config = c;
  const Eigen::Index d = c.hidden, ff = c.intermediate;
  model.embedding = stored(m.matrix("model.embed_tokens.weight", c.vocab, d));
  const bool tied = m.config().value("tie_word_embeddings", false) || !m.contains("lm_head.weight");
  model.lm_head = stored(m.linear(tied ? "model.embed_tokens.weight" : "lm_head.weight", c.vocab, d));
  model.final_norm = vec("model.norm.weight", d);
  for (Eigen::Index l = 0; l < c.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto linear = [&](const std::string& name, Eigen::Index out, Eigen::Index in) {
      return nn::DenseLinear<S>(stored(m.linear(p + name, out, in)));
    };
    model.layers.push_back({vec(p + "input_layernorm.weight", d), vec(p + "post_attention_layernorm.weight", d), attention(l),
                            linear("mlp.gate_proj.weight", ff, d), linear("mlp.up_proj.weight", ff, d),
                            linear("mlp.down_proj.weight", d, ff)});
  }
  return model;
}

}  // namespace detail

/// Loads a LLaMA model folder, weights stored in S.
template <typename S = float>
nn::LlamaModel<S> load_llama(const std::string& dir) {
  const ModelFolder m = ModelFolder::open(dir);
  const std::vector<AttentionLayout> layouts = attention_layers(Arch::LLaMA, m);
  return detail::llama_model<S, nn::MultiHeadAttention<S>>(m, [&](Eigen::Index l) {
    const AttentionLayout& a = layouts[static_cast<std::size_t>(l)];
    return nn::MultiHeadAttention<S>(a.config, a.load().template cast<S>());
  });
}

}  // namespace bd::io
