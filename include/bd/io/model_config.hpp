// bd/io/model_config.hpp — what bd reads from a model's config.json, in one place: the LLaMA
// family's and DeepSeek-V2/V3's shapes, their RoPE schemes (nn/rope.hpp) as each family's own
// code computes them, and the refusal, by key and value, of every config feature that changes
// the layer's output and that bd does not implement (a model bd cannot compute is refused, never
// run as another model).
//
// LLaMA family (model_type llama, mistral, qwen2; Hugging Face's modeling code):
//   rope_scaling.rope_type (or .type): default, linear, dynamic, llama3, yarn
//     yarn: factor; original_max_position_embeddings (else max_position_embeddings); cos/sin
//     scaled by attention_factor, else mscale(factor, mscale)/mscale(factor, mscale_all_dim) when
//     both are set, else mscale(factor) = 0.1·ln(factor) + 1; beta_fast 32, beta_slow 1, truncate.
//   refused: other rope types, partial_rotary_factor ≠ 1, logit soft-capping, q/k norms, MLP
//   biases, an activation other than silu, a sliding window (unless the sequence fits in it:
//   AttentionConfig::sliding_window, checked when the layer runs), other model types.
// DeepSeek-V2/V3 (model_type deepseek_v2, deepseek_v3; DeepSeek's modeling_deepseek.py):
//   RoPE on the decoupled channels, stored interleaved (rope_interleave, default true);
//   rope_scaling type yarn (also linear, dynamic): original_max_position_embeddings (4096),
//   beta_fast 32, beta_slow 1, cos/sin scaled by mscale(factor, mscale)/mscale(factor,
//   mscale_all_dim) with mscale 1, mscale_all_dim 0 by default; the softmax scale multiplied by
//   mscale(factor, mscale_all_dim)² when mscale_all_dim is set.
#pragma once

#include <cmath>
#include <string>

#include <Eigen/Core>
#include <nlohmann/json.hpp>

#include "bd/base/error.hpp"
#include "bd/io/model_folder.hpp"
#include "bd/nn/llama.hpp"
#include "bd/nn/rope.hpp"

namespace bd::io {

/// A number in config.json (integer or float), `fallback` when absent or null.
inline double config_number(const nlohmann::json& j, const char* key, double fallback, const std::string& where) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  const auto& v = j.at(key);
  if (!v.is_number() || !std::isfinite(v.get<double>()))
    throw FormatError(bd::detail::message(where, ": '", key, "' is ", v.dump(), ", expected a number"));
  return v.get<double>();
}

namespace detail {

using bd::detail::message;

/// YaRN's mscale(s, m) = 0.1·m·ln(s) + 1 for a scale s > 1 (1 otherwise).
inline double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

inline void refuse(const std::string& where, const std::string& key, const nlohmann::json& value, const std::string& why) {
  throw RefusedError(message(where, ": ", key, " = ", value.dump(), " is not implemented by bd (", why,
                             "); refusing rather than computing another model"));
}

/// Whether a config key is present with a value other than null/false (or `neutral`).
inline bool set_to_other_than(const nlohmann::json& j, const char* key, const nlohmann::json& neutral = nullptr) {
  if (!j.contains(key)) return false;
  const auto& v = j.at(key);
  return !v.is_null() && !(v.is_boolean() && !v.get<bool>()) && v != neutral;
}

/// rope_scaling's type ("rope_type", or the older "type"); "default" when there is none.
inline std::string rope_type_name(const nlohmann::json& j, const std::string& where) {
  if (!j.contains("rope_scaling") || j.at("rope_scaling").is_null()) return "default";
  const auto& r = j.at("rope_scaling");
  if (!r.is_object()) throw FormatError(message(where, ": rope_scaling is ", r.dump(), ", expected an object or null"));
  const char* key = r.contains("rope_type") ? "rope_type" : "type";
  if (!r.contains(key) || !r.at(key).is_string())
    throw FormatError(message(where, ": rope_scaling has no rope_type (or type) string"));
  return r.at(key).get<std::string>();
}

/// The scheme with the fields every family reads the same way (factor, the llama3 and yarn
/// parameters); the family fills in the pretraining context and the attention factor.
inline nn::RopeScaling rope_scheme(const nlohmann::json& j, const std::string& type, const std::string& where) {
  nn::RopeScaling s;
  if (type == "default") return s;
  const std::string at = where + " rope_scaling";
  const nlohmann::json& r = j.at("rope_scaling");
  if (type == "linear") s.type = nn::RopeType::Linear;
  else if (type == "dynamic") s.type = nn::RopeType::Dynamic;
  else if (type == "llama3") s.type = nn::RopeType::Llama3;
  else if (type == "yarn") s.type = nn::RopeType::Yarn;
  else refuse(where, "rope_scaling.rope_type", type, "bd implements default, linear, dynamic, llama3 and yarn");
  s.factor = config_number(r, "factor", 0, at);
  if (!(s.factor > 0)) throw FormatError(message(at, ": '", type, "' needs a positive factor"));
  s.low_freq_factor = config_number(r, "low_freq_factor", 1, at);
  s.high_freq_factor = config_number(r, "high_freq_factor", 4, at);
  s.beta_fast = config_number(r, "beta_fast", 32, at);
  s.beta_slow = config_number(r, "beta_slow", 1, at);
  if (r.contains("truncate") && r.at("truncate").is_boolean()) s.truncate = r.at("truncate").get<bool>();
  return s;
}

}  // namespace detail

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

/// DeepSeek-V2/V3's attention as config.json gives it (DeepSeek's modeling code's reading).
struct DeepSeekConfig {
  Eigen::Index hidden = 0, heads = 0, layers = 0, kv_lora = 0, nope = 0, rope = 0, v_head_dim = 0;
  Eigen::Index q_lora = 0;  ///< 0: queries straight from x (q_proj)
  double rope_theta = 10000, norm_eps = 1e-6;
  double scale = 0;          ///< the softmax scale, mscale² included
  nn::RopeScaling rope_scaling;
  bool interleaved = true;   ///< RoPE channels stored as pairs (2k, 2k + 1)
};

inline DeepSeekConfig deepseek_config(const nlohmann::json& j, const std::string& where) {
  if (j.contains("model_type") && j.at("model_type") != "deepseek_v2" && j.at("model_type") != "deepseek_v3")
    detail::refuse(where, "model_type", j.at("model_type"), "the DeepSeek layout bd reads is deepseek_v2's and deepseek_v3's");
  DeepSeekConfig c;
  c.hidden = config_int(j, {"hidden_size"}, where);
  c.heads = config_int(j, {"num_attention_heads"}, where);
  c.layers = config_int(j, {"num_hidden_layers"}, where);
  c.kv_lora = config_int(j, {"kv_lora_rank"}, where);
  c.nope = config_int(j, {"qk_nope_head_dim"}, where);
  c.rope = config_int(j, {"qk_rope_head_dim"}, where);
  c.v_head_dim = config_int(j, {"v_head_dim"}, where);
  c.q_lora = config_int_or(j, "q_lora_rank", 0, where);
  c.rope_theta = config_number(j, "rope_theta", 10000.0, where);
  c.norm_eps = config_number(j, "rms_norm_eps", 1e-6, where);
  if (j.contains("rope_interleave") && j.at("rope_interleave").is_boolean()) c.interleaved = j.at("rope_interleave").get<bool>();
  c.scale = 1.0 / std::sqrt(double(c.nope + c.rope));
  const std::string type = detail::rope_type_name(j, where);
  if (type == "llama3") detail::refuse(where, "rope_scaling.type", type, "DeepSeek's code implements linear, dynamic and yarn");
  c.rope_scaling = detail::rope_scheme(j, type, where);
  if (c.rope_scaling.type != nn::RopeType::Standard) {
    const nlohmann::json& r = j.at("rope_scaling");
    const std::string at = where + " rope_scaling";
    const double factor = c.rope_scaling.factor;
    if (c.rope_scaling.type == nn::RopeType::Dynamic)
      c.rope_scaling.original_context = config_number(j, "max_position_embeddings", 0, where);
    if (c.rope_scaling.type == nn::RopeType::Yarn) {
      c.rope_scaling.original_context = config_number(r, "original_max_position_embeddings", 4096, at);
      c.rope_scaling.truncate = true;
      const double mscale = config_number(r, "mscale", 1, at), mscale_all = config_number(r, "mscale_all_dim", 0, at);
      c.rope_scaling.attention_factor = detail::yarn_mscale(factor, mscale) / detail::yarn_mscale(factor, mscale_all);
    }
    // DeepSeek scales the softmax under any rope_scaling that sets mscale_all_dim.
    const double mscale_all = config_number(r, "mscale_all_dim", 0, at);
    if (mscale_all != 0) c.scale *= detail::yarn_mscale(factor, mscale_all) * detail::yarn_mscale(factor, mscale_all);
    c.rope_scaling.validate();
  }
  return c;
}

}  // namespace bd::io
