// bd/io/llama.hpp — the LLaMA family (model_type llama, mistral, qwen2) as Hugging Face stores
// it: config.json read as its modeling code reads it, the attention layers, and the whole model.
//
//   P = model.layers.{l}.self_attn   {q,k,v,o}_proj [out, in], optional q/k/v biases, GQA, RoPE
//   the rest: model.embed_tokens, model.norm, lm_head (or tied), input_layernorm,
//   post_attention_layernorm, mlp.{gate,up,down}_proj; HF stores linear weights [out, in] and bd
//   uses x·W, so they are transposed on load. Every tensor's presence, dtype and shape is checked
//   against config.json.
//
// rope_scaling.rope_type (or .type): default, linear, dynamic, llama3, yarn
//   yarn: factor; original_max_position_embeddings (else max_position_embeddings); cos/sin
//   scaled by attention_factor, else mscale(factor, mscale)/mscale(factor, mscale_all_dim) when
//   both are set, else mscale(factor) = 0.1·ln(factor) + 1; beta_fast 32, beta_slow 1, truncate.
// refused: other rope types, partial_rotary_factor ≠ 1, logit soft-capping, q/k norms, MLP
// biases, an activation other than silu, a sliding window (unless the sequence fits in it:
// AttentionConfig::sliding_window, checked when the layer runs), other model types.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <Eigen/Core>
#include <nlohmann/json.hpp>

#include "bd/base/error.hpp"
#include "bd/core/scalar.hpp"
#include "bd/io/attention_layout.hpp"
#include "bd/io/model_config.hpp"
#include "bd/io/model_folder.hpp"
#include "bd/nn/llama.hpp"
#include "bd/nn/multi_head_attention.hpp"

namespace bd::io {

/// The RoPE scheme of a LLaMA-family config, as Hugging Face's rotary initialisation computes it.
inline nn::RopeScaling llama_rope_scaling(const nlohmann::json& j, const std::string& where) {
  const std::string type = detail::rope_type_name(j, where);
  nn::RopeScaling s = detail::rope_scheme(j, type, where);
  if (s.type == nn::RopeType::Standard) return s;
  const nlohmann::json& r = j.at("rope_scaling");
  const std::string at = where + " rope_scaling";
  const double max_positions = config_number(j, "max_position_embeddings", 0, where);
  if (s.type == nn::RopeType::Dynamic) s.original_context = max_positions;
  if (s.type == nn::RopeType::Llama3) {
    if (!r.contains("original_max_position_embeddings"))
      throw FormatError(bd::detail::message(at, ": llama3 needs original_max_position_embeddings"));
    s.original_context = config_number(r, "original_max_position_embeddings", 0, at);
  }
  if (s.type == nn::RopeType::Yarn) {
    s.original_context = config_number(r, "original_max_position_embeddings", max_positions, at);
    const double mscale = config_number(r, "mscale", 0, at), mscale_all = config_number(r, "mscale_all_dim", 0, at);
    s.attention_factor = config_number(
        r, "attention_factor",
        mscale != 0 && mscale_all != 0 ? detail::yarn_mscale(s.factor, mscale) / detail::yarn_mscale(s.factor, mscale_all)
                                       : detail::yarn_mscale(s.factor, 1),
        at);
  }
  s.validate();
  return s;
}

/// A LLaMA-family config.json (llama, mistral, qwen2) as bd's LlamaConfig; refuses what bd does
/// not implement (see the file comment), naming the key and its value.
inline nn::LlamaConfig llama_config(const nlohmann::json& j, const std::string& where) {
  using detail::refuse;
  using detail::set_to_other_than;
  const std::string model_type = j.contains("model_type") && j.at("model_type").is_string() ? j.at("model_type").get<std::string>()
                                                                                               : "llama";
  if (model_type != "llama" && model_type != "mistral" && model_type != "qwen2")
    refuse(where, "model_type", model_type, "the LLaMA layout bd reads is that of llama, mistral and qwen2");
  if (j.contains("hidden_act") && j.at("hidden_act") != "silu")
    refuse(where, "hidden_act", j.at("hidden_act"), "bd's MLP is SwiGLU with silu");
  if (set_to_other_than(j, "partial_rotary_factor", 1.0) && config_number(j, "partial_rotary_factor", 1, where) != 1.0)
    refuse(where, "partial_rotary_factor", j.at("partial_rotary_factor"), "bd rotates every channel of a head");
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"})
    if (set_to_other_than(j, key)) refuse(where, key, j.at(key), "bd's softmax and head do not soft-cap logits");
  for (const char* key : {"use_qk_norm", "qk_layernorm", "qk_norm"})
    if (set_to_other_than(j, key)) refuse(where, key, j.at(key), "bd's attention has no q/k norms");
  if (set_to_other_than(j, "mlp_bias")) refuse(where, "mlp_bias", j.at("mlp_bias"), "bd's LLaMA MLP has no biases");
  for (const char* key : {"attention_multiplier", "embedding_multiplier", "residual_multiplier", "logits_scaling",
                          "query_pre_attn_scalar", "layer_types", "no_rope_layers"})
    if (set_to_other_than(j, key)) refuse(where, key, j.at(key), "not part of the LLaMA computation bd implements");
  nn::LlamaConfig c;
  c.hidden = config_int(j, {"hidden_size"}, where);
  c.intermediate = config_int(j, {"intermediate_size"}, where);
  c.layers = config_int(j, {"num_hidden_layers"}, where);
  c.heads = config_int(j, {"num_attention_heads"}, where);
  c.kv_heads = config_int_or(j, "num_key_value_heads", c.heads, where);
  c.vocab = config_int(j, {"vocab_size"}, where);
  c.head_dim = config_int_or(j, "head_dim", c.hidden / c.heads, where);
  c.rms_eps = config_number(j, "rms_norm_eps", 1e-5, where);
  c.rope_theta = config_number(j, "rope_theta", 10000.0, where);
  c.rope_scaling = llama_rope_scaling(j, where);
  // Mistral's window applies whenever set; Qwen2's only with use_sliding_window.
  const bool window = model_type == "qwen2" ? set_to_other_than(j, "use_sliding_window") : set_to_other_than(j, "sliding_window");
  if (window) c.sliding_window = config_int(j, {"sliding_window"}, where);
  if (c.heads % c.kv_heads)
    throw FormatError(bd::detail::message(where, ": num_attention_heads ", c.heads, " is not a multiple of num_key_value_heads ",
                                          c.kv_heads));
  return c;
}

namespace detail {

BD_DEFERRED std::vector<AttentionLayout> llama_layers(const ModelFolder& m, std::optional<nn::Mode> converted) {
  const nn::LlamaConfig c = llama_config(m.config(), m.config_path());
  std::vector<AttentionLayout> out;
  for (Eigen::Index l = 0; l < c.layers; ++l) {
    const std::string p = message("model.layers.", l, ".self_attn");
    nn::AttentionConfig ac;
    ac.n_q = c.heads;
    ac.n_kv = c.kv_heads;
    ac.head_dim = c.head_dim;
    ac.causal = true;
    ac.rope_theta = c.rope_theta;
    ac.rope_scaling = c.rope_scaling;
    ac.sliding_window = c.sliding_window;
    for (const char* norm : {".q_norm.weight", ".k_norm.weight"})
      if (m.contains(p + norm))
        throw RefusedError(message(m.dir(), ": ", p, norm, " is a q/k norm, which bd's attention does not implement; "
                                   "refusing rather than computing another model"));
    out.push_back(linear_layout(m, p, ac, p + ".q_proj", p + ".k_proj", p + ".v_proj", p + ".o_proj", c.hidden, converted));
  }
  return out;
}


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
  const std::vector<AttentionLayout> layouts = detail::llama_layers(m, std::nullopt);
  return detail::llama_model<S, nn::MultiHeadAttention<S>>(m, [&](Eigen::Index l) {
    const AttentionLayout& a = layouts[static_cast<std::size_t>(l)];
    return nn::MultiHeadAttention<S>(a.config, a.load().template cast<S>());
  });
}

/// The instantiations bd::compiled holds (src/compiled_io.cpp), extern under BD_COMPILED_LIB.
#define BD_LLAMA_INSTANTIATIONS(prefix) \
  prefix std::vector<AttentionLayout> detail::llama_layers<>(const ModelFolder&, std::optional<nn::Mode>);
#ifdef BD_COMPILED_LIB
BD_LLAMA_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::io
