// bd/io/hf_llama.hpp — loads a Hugging Face LLaMA folder (config.json, model.safetensors)
// into bd::nn::LlamaModel. HF stores linear weights [out, in]; bd uses x·W, so they are
// transposed on load. Every tensor's presence and shape is checked against config.json.
#pragma once

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "bd/core/error.hpp"
#include "bd/io/safetensors.hpp"
#include "bd/nn/llama.hpp"

namespace bd::io {

inline nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw FormatError(bd::detail::message(path, ": cannot open"));
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) throw FormatError(bd::detail::message(path, ": not a JSON object"));
  return j;
}

inline bd::nn::LlamaConfig llama_config(const nlohmann::json& j, const std::string& where) {
  auto get = [&](const char* key) -> Eigen::Index {
    if (!j.contains(key) || !j.at(key).is_number_integer() || j.at(key).get<long long>() <= 0)
      throw FormatError(bd::detail::message(where, ": '", key, "' is missing or not a positive integer"));
    return j.at(key).get<Eigen::Index>();
  };
  bd::nn::LlamaConfig c;
  c.hidden = get("hidden_size");
  c.intermediate = get("intermediate_size");
  c.layers = get("num_hidden_layers");
  c.heads = get("num_attention_heads");
  c.kv_heads = j.contains("num_key_value_heads") ? get("num_key_value_heads") : c.heads;
  c.vocab = get("vocab_size");
  c.head_dim = j.contains("head_dim") ? get("head_dim") : c.hidden / c.heads;
  c.rms_eps = j.value("rms_norm_eps", 1e-5);
  c.rope_theta = j.value("rope_theta", 10000.0);
  if (c.heads % c.kv_heads)
    throw FormatError(bd::detail::message(where, ": num_attention_heads ", c.heads, " is not a multiple of num_key_value_heads ",
                                          c.kv_heads));
  return c;
}

/// Loads MODEL_DIR/config.json and MODEL_DIR/model.safetensors, weights stored in S.
template <typename S = float>
bd::nn::LlamaModel<S> load_llama(const std::string& dir) {
  const std::string config_path = dir + "/config.json";
  const nlohmann::json j = read_json_file(config_path);
  const bd::nn::LlamaConfig c = llama_config(j, config_path);
  const SafeTensors st = SafeTensors::open(dir + "/model.safetensors");
  auto tensor = [&](const std::string& name, Eigen::Index rows, Eigen::Index cols) {
    const TensorInfo& t = st.info(name);
    const auto [r, k] = t.matrix_shape();
    if (r != rows || k != cols)
      throw FormatError(bd::detail::message(st.source(), ": tensor '", name, "' is ", r, "x", k, ", expected ", rows, "x",
                                            cols, " from config.json"));
    Eigen::MatrixXd m = st.matrix<double>(name);
    bd::detail::require_finite(m, name);
    return m;
  };
  auto stored = [](const Eigen::MatrixXd& m) { return round_matrix<S>(m); };
  auto vec = [&](const std::string& name, Eigen::Index n) -> Eigen::Matrix<S, Eigen::Dynamic, 1> {
    return stored(tensor(name, n, 1));
  };

  bd::nn::LlamaModel<S> model;
  model.config = c;
  const Eigen::Index d = c.hidden, ff = c.intermediate, dh = c.head_dim;
  model.embedding = stored(tensor("model.embed_tokens.weight", c.vocab, d));
  const bool tied = j.value("tie_word_embeddings", false) || !st.contains("lm_head.weight");
  model.lm_head = tied ? stored(tensor("model.embed_tokens.weight", c.vocab, d).transpose())
                       : stored(tensor("lm_head.weight", c.vocab, d).transpose());
  model.final_norm = vec("model.norm.weight", d);
  for (Eigen::Index l = 0; l < c.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    bd::nn::AttentionConfig ac;
    ac.n_q = c.heads;
    ac.n_kv = c.kv_heads;
    ac.head_dim = dh;
    ac.causal = true;
    ac.rope_theta = c.rope_theta;
    bd::nn::AttentionWeights<S> w;
    w.Wq = stored(tensor(p + "self_attn.q_proj.weight", c.heads * dh, d).transpose());
    w.Wk = stored(tensor(p + "self_attn.k_proj.weight", c.kv_heads * dh, d).transpose());
    w.Wv = stored(tensor(p + "self_attn.v_proj.weight", c.kv_heads * dh, d).transpose());
    w.Wo = stored(tensor(p + "self_attn.o_proj.weight", d, c.heads * dh).transpose());
    bd::nn::LlamaLayer<S, bd::nn::MultiHeadAttention<S>> layer{
        vec(p + "input_layernorm.weight", d),
        vec(p + "post_attention_layernorm.weight", d),
        bd::nn::MultiHeadAttention<S>(ac, std::move(w)),
        stored(tensor(p + "mlp.gate_proj.weight", ff, d).transpose()),
        stored(tensor(p + "mlp.up_proj.weight", ff, d).transpose()),
        stored(tensor(p + "mlp.down_proj.weight", d, ff).transpose())};
    model.layers.push_back(std::move(layer));
  }
  return model;
}

}  // namespace bd::io
