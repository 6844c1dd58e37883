// bd/io/checkpoint.hpp — where the attention weights of a Hugging Face checkpoint live.
//
// For each architecture, each layer's attention is read into bd::nn weights (x·W orientation,
// double) together with what a conversion does to the source tensors: which ones the QK and
// VO products consume, and — for fused tensors whose other part stays dense — the slice that
// is kept, under a documented name:
//
//   gpt2         P = h.{l}.attn          c_attn [d, 3d] (Conv1D [in, out], q|k|v) + bias, c_proj [d, d] + bias
//                kept: P.c_attn_v.{weight,bias} (qk only), P.c_attn_qk.{weight,bias} (vo only)
//   bert         P = …layer.{l}.attention  self.{query,key,value}, output.dense (nn.Linear [out, in]) + biases
//   llama        P = model.layers.{l}.self_attn  {q,k,v,o}_proj [out, in], optional q/k/v biases, GQA, RoPE
//   deepseek-v2  P = model.layers.{l}.self_attn  q_proj (or q_a_proj/q_a_layernorm/q_b_proj),
//                kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj (per head: k_nope rows, then v rows), o_proj
//                kept: P.q_rope_proj.weight / P.q_b_rope_proj.weight (the RoPE rows of the query
//                projection, qk), P.kv_b_proj_v.weight (qk only), P.kv_b_proj_k.weight (vo only)
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <Eigen/Core>
#include <nlohmann/json.hpp>

#include "bd/core/error.hpp"
#include "bd/io/hf_llama.hpp"
#include "bd/io/safetensors.hpp"
#include "bd/nn/attention_config.hpp"

namespace bd::io {

enum class Arch { GPT2, BERT, LLaMA, DeepSeekV2 };

inline const char* to_string(Arch a) {
  switch (a) {
    case Arch::GPT2: return "gpt2";
    case Arch::BERT: return "bert";
    case Arch::LLaMA: return "llama";
    case Arch::DeepSeekV2: return "deepseek-v2";
  }
  return "?";
}

inline Arch parse_arch(const std::string& s) {
  for (Arch a : {Arch::GPT2, Arch::BERT, Arch::LLaMA, Arch::DeepSeekV2})
    if (s == to_string(a)) return a;
  throw RangeError("unknown architecture '" + s + "': expected gpt2, bert, llama or deepseek-v2");
}

/// A part of a source tensor that stays dense under a new name: the given rows (axis 0) or
/// columns (axis 1) of the stored tensor, in its stored dtype and orientation.
struct KeptPart {
  std::string name, source;
  int axis = 0;
  std::vector<Eigen::Index> indices;
};

/// One attention layer as the checkpoint stores it, and what converting it touches.
struct AttentionLayout {
  std::string prefix;  ///< P
  nn::AttentionConfig config;
  nn::AttentionWeights<double> weights;  ///< only what the QK and VO products need
  std::vector<std::string> qk_sources, vo_sources;  ///< tensors consumed by QK, by VO (may overlap)
  std::vector<KeptPart> keep_without_vo;            ///< kept when QK is converted and VO is not
  std::vector<KeptPart> keep_without_qk;            ///< kept when VO is converted and QK is not
  std::vector<KeptPart> keep_with_qk;               ///< kept whenever QK is converted
};

namespace detail {

using bd::detail::message;

inline std::vector<Eigen::Index> range(Eigen::Index begin, Eigen::Index end) {
  std::vector<Eigen::Index> out;
  for (Eigen::Index i = begin; i < end; ++i) out.push_back(i);
  return out;
}

inline Eigen::Index config_int(const nlohmann::json& j, std::initializer_list<const char*> keys, const std::string& where) {
  for (const char* k : keys)
    if (j.contains(k) && j.at(k).is_number_integer() && j.at(k).get<long long>() > 0) return j.at(k).get<Eigen::Index>();
  throw FormatError(message(where, ": config lacks a positive integer '", *keys.begin(), "'"));
}

/// Finds the prefix before `suffix` among the tensor names ("transformer." in "transformer.h.0…").
inline std::string find_prefix(const SafeTensors& st, const std::string& suffix, const std::string& what) {
  for (const auto& t : st.tensors()) {
    if (t.name.size() >= suffix.size() && t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return t.name.substr(0, t.name.size() - suffix.size());
  }
  throw FormatError(message(st.source(), ": no tensor ending in '", suffix, "': not a ", what, " checkpoint"));
}

/// A stored tensor as a double matrix with an expected shape.
inline Eigen::MatrixXd tensor(const SafeTensors& st, const std::string& name, Eigen::Index rows, Eigen::Index cols) {
  const TensorInfo& t = st.info(name);
  const auto [r, c] = t.matrix_shape();
  if (r != rows || c != cols)
    throw FormatError(message(st.source(), ": tensor '", name, "' is ", r, "x", c, ", expected ", rows, "x", cols,
                              " from config.json"));
  Eigen::MatrixXd m = st.matrix<double>(name);
  bd::detail::require_finite(m, name);
  return m;
}

inline std::optional<Eigen::VectorXd> optional_bias(const SafeTensors& st, const std::string& name, Eigen::Index n) {
  if (!st.contains(name)) return std::nullopt;
  return Eigen::VectorXd(tensor(st, name, n, 1));
}

inline std::vector<AttentionLayout> gpt2_layers(const nlohmann::json& j, const SafeTensors& st, const std::string& where) {
  const Eigen::Index d = config_int(j, {"n_embd", "hidden_size"}, where);
  const Eigen::Index heads = config_int(j, {"n_head", "num_attention_heads"}, where);
  const Eigen::Index layers = config_int(j, {"n_layer", "num_hidden_layers"}, where);
  const std::string pre = find_prefix(st, "h.0.attn.c_attn.weight", "gpt2");
  std::vector<AttentionLayout> out;
  for (Eigen::Index l = 0; l < layers; ++l) {
    AttentionLayout a;
    a.prefix = message(pre, "h.", l, ".attn");
    const std::string attn = a.prefix + ".c_attn", proj = a.prefix + ".c_proj";
    a.config.n_q = a.config.n_kv = heads;
    a.config.head_dim = d / heads;
    a.config.causal = true;
    const Eigen::MatrixXd W = tensor(st, attn + ".weight", d, 3 * d);  // Conv1D: [in, out]
    a.weights.Wq = W.leftCols(d);
    a.weights.Wk = W.middleCols(d, d);
    a.weights.Wv = W.rightCols(d);
    if (auto b = optional_bias(st, attn + ".bias", 3 * d)) {
      a.weights.bq = b->head(d);
      a.weights.bk = b->segment(d, d);
      a.weights.bv = b->tail(d);
    }
    a.weights.Wo = tensor(st, proj + ".weight", d, d);
    if (auto b = optional_bias(st, proj + ".bias", d)) a.weights.bo = *b;
    const bool bias = st.contains(attn + ".bias");
    a.qk_sources = {attn + ".weight"};
    a.vo_sources = {attn + ".weight", proj + ".weight"};
    if (bias) {
      a.qk_sources.push_back(attn + ".bias");
      a.vo_sources.push_back(attn + ".bias");
    }
    if (st.contains(proj + ".bias")) a.vo_sources.push_back(proj + ".bias");
    a.keep_without_vo.push_back({a.prefix + ".c_attn_v.weight", attn + ".weight", 1, range(2 * d, 3 * d)});
    a.keep_without_qk.push_back({a.prefix + ".c_attn_qk.weight", attn + ".weight", 1, range(0, 2 * d)});
    if (bias) {
      a.keep_without_vo.push_back({a.prefix + ".c_attn_v.bias", attn + ".bias", 0, range(2 * d, 3 * d)});
      a.keep_without_qk.push_back({a.prefix + ".c_attn_qk.bias", attn + ".bias", 0, range(0, 2 * d)});
    }
    out.push_back(std::move(a));
  }
  return out;
}

inline std::vector<AttentionLayout> bert_layers(const nlohmann::json& j, const SafeTensors& st, const std::string& where) {
  const Eigen::Index d = config_int(j, {"hidden_size"}, where);
  const Eigen::Index heads = config_int(j, {"num_attention_heads"}, where);
  const Eigen::Index layers = config_int(j, {"num_hidden_layers"}, where);
  const std::string pre = find_prefix(st, "encoder.layer.0.attention.self.query.weight", "bert");
  std::vector<AttentionLayout> out;
  for (Eigen::Index l = 0; l < layers; ++l) {
    AttentionLayout a;
    a.prefix = message(pre, "encoder.layer.", l, ".attention");
    const std::string q = a.prefix + ".self.query", k = a.prefix + ".self.key", v = a.prefix + ".self.value",
                      o = a.prefix + ".output.dense";
    a.config.n_q = a.config.n_kv = heads;
    a.config.head_dim = d / heads;
    a.weights.Wq = tensor(st, q + ".weight", d, d).transpose();  // nn.Linear: [out, in]
    a.weights.Wk = tensor(st, k + ".weight", d, d).transpose();
    a.weights.Wv = tensor(st, v + ".weight", d, d).transpose();
    a.weights.Wo = tensor(st, o + ".weight", d, d).transpose();
    if (auto b = optional_bias(st, q + ".bias", d)) a.weights.bq = *b;
    if (auto b = optional_bias(st, k + ".bias", d)) a.weights.bk = *b;
    if (auto b = optional_bias(st, v + ".bias", d)) a.weights.bv = *b;
    if (auto b = optional_bias(st, o + ".bias", d)) a.weights.bo = *b;
    for (const std::string& n : {q, k})
      for (const char* s : {".weight", ".bias"})
        if (st.contains(n + s)) a.qk_sources.push_back(n + s);
    for (const std::string& n : {v, o})
      for (const char* s : {".weight", ".bias"})
        if (st.contains(n + s)) a.vo_sources.push_back(n + s);
    out.push_back(std::move(a));
  }
  return out;
}

inline std::vector<AttentionLayout> llama_layers(const nlohmann::json& j, const SafeTensors& st, const std::string& where) {
  const nn::LlamaConfig c = llama_config(j, where);
  std::vector<AttentionLayout> out;
  for (Eigen::Index l = 0; l < c.layers; ++l) {
    AttentionLayout a;
    a.prefix = message("model.layers.", l, ".self_attn");
    const std::string p = a.prefix + ".";
    a.config.n_q = c.heads;
    a.config.n_kv = c.kv_heads;
    a.config.head_dim = c.head_dim;
    a.config.causal = true;
    a.config.rope_theta = c.rope_theta;
    const Eigen::Index d = c.hidden, dq = c.heads * c.head_dim, dkv = c.kv_heads * c.head_dim;
    a.weights.Wq = tensor(st, p + "q_proj.weight", dq, d).transpose();
    a.weights.Wk = tensor(st, p + "k_proj.weight", dkv, d).transpose();
    a.weights.Wv = tensor(st, p + "v_proj.weight", dkv, d).transpose();
    a.weights.Wo = tensor(st, p + "o_proj.weight", d, dq).transpose();
    if (auto b = optional_bias(st, p + "q_proj.bias", dq)) a.weights.bq = *b;
    if (auto b = optional_bias(st, p + "k_proj.bias", dkv)) a.weights.bk = *b;
    if (auto b = optional_bias(st, p + "v_proj.bias", dkv)) a.weights.bv = *b;
    if (auto b = optional_bias(st, p + "o_proj.bias", d)) a.weights.bo = *b;
    for (const char* n : {"q_proj", "k_proj"})
      for (const char* s : {".weight", ".bias"})
        if (st.contains(p + n + s)) a.qk_sources.push_back(p + n + s);
    for (const char* n : {"v_proj", "o_proj"})
      for (const char* s : {".weight", ".bias"})
        if (st.contains(p + n + s)) a.vo_sources.push_back(p + n + s);
    out.push_back(std::move(a));
  }
  return out;
}

inline std::vector<AttentionLayout> deepseek_layers(const nlohmann::json& j, const SafeTensors& st, const std::string& where) {
  const Eigen::Index d = config_int(j, {"hidden_size"}, where);
  const Eigen::Index heads = config_int(j, {"num_attention_heads"}, where);
  const Eigen::Index layers = config_int(j, {"num_hidden_layers"}, where);
  const Eigen::Index kv_lora = config_int(j, {"kv_lora_rank"}, where);
  const Eigen::Index nope = config_int(j, {"qk_nope_head_dim"}, where);
  const Eigen::Index rope = config_int(j, {"qk_rope_head_dim"}, where);
  const Eigen::Index dv = config_int(j, {"v_head_dim"}, where);
  const bool q_lora = j.contains("q_lora_rank") && j.at("q_lora_rank").is_number_integer();
  const Eigen::Index d_q = q_lora ? config_int(j, {"q_lora_rank"}, where) : d;
  std::vector<AttentionLayout> out;
  for (Eigen::Index l = 0; l < layers; ++l) {
    AttentionLayout a;
    a.prefix = message("model.layers.", l, ".self_attn");
    const std::string p = a.prefix + ".";
    a.config.n_q = a.config.n_kv = heads;
    a.config.head_dim = nope;
    a.config.v_head_dim = dv;
    a.config.causal = true;
    a.config.scale = 1.0 / std::sqrt(double(nope + rope));
    const std::string q_name = p + (q_lora ? "q_b_proj.weight" : "q_proj.weight");
    const Eigen::MatrixXd q = tensor(st, q_name, heads * (nope + rope), d_q);        // [out, in]
    const Eigen::MatrixXd kv_b = tensor(st, p + "kv_b_proj.weight", heads * (nope + dv), kv_lora);
    const Eigen::MatrixXd o = tensor(st, p + "o_proj.weight", d, heads * dv);
    std::vector<Eigen::Index> q_nope_rows, q_rope_rows, k_rows, v_rows;
    for (Eigen::Index h = 0; h < heads; ++h) {
      for (Eigen::Index i = 0; i < nope; ++i) q_nope_rows.push_back(h * (nope + rope) + i);
      for (Eigen::Index i = 0; i < rope; ++i) q_rope_rows.push_back(h * (nope + rope) + nope + i);
      for (Eigen::Index i = 0; i < nope; ++i) k_rows.push_back(h * (nope + dv) + i);
      for (Eigen::Index i = 0; i < dv; ++i) v_rows.push_back(h * (nope + dv) + nope + i);
    }
    a.weights.Wq = q(q_nope_rows, Eigen::all).transpose();   // d_q × n·nope
    a.weights.Wk = kv_b(k_rows, Eigen::all).transpose();     // kv_lora × n·nope (W_uk)
    a.weights.Wv = kv_b(v_rows, Eigen::all).transpose();     // kv_lora × n·dv (W_uv)
    a.weights.Wo = o.transpose();                            // n·dv × d
    a.qk_sources = {q_name, p + "kv_b_proj.weight"};
    a.vo_sources = {p + "kv_b_proj.weight", p + "o_proj.weight"};
    a.keep_with_qk.push_back({p + (q_lora ? "q_b_rope_proj.weight" : "q_rope_proj.weight"), q_name, 0, q_rope_rows});
    a.keep_without_vo.push_back({p + "kv_b_proj_v.weight", p + "kv_b_proj.weight", 0, v_rows});
    a.keep_without_qk.push_back({p + "kv_b_proj_k.weight", p + "kv_b_proj.weight", 0, k_rows});
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace detail

/// Reads every attention layer of a checkpoint of the given architecture.
inline std::vector<AttentionLayout> attention_layers(Arch arch, const nlohmann::json& config, const SafeTensors& st,
                                                     const std::string& where) {
  switch (arch) {
    case Arch::GPT2: return detail::gpt2_layers(config, st, where);
    case Arch::BERT: return detail::bert_layers(config, st, where);
    case Arch::LLaMA: return detail::llama_layers(config, st, where);
    case Arch::DeepSeekV2: return detail::deepseek_layers(config, st, where);
  }
  return {};
}

}  // namespace bd::io
