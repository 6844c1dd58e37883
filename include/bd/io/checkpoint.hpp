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
//                (read as the whole MLA layer: query LoRA, latent, decoupled RoPE; also for V3)
//                kept: P.q_rope_proj.weight / P.q_b_rope_proj.weight (the RoPE rows of the query
//                projection, qk), P.kv_b_proj_v.weight (qk only), P.kv_b_proj_k.weight (vo only)
#pragma once

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <Eigen/Core>
#include <nlohmann/json.hpp>

#include "bd/base/deferred.hpp"
#include "bd/base/error.hpp"
#include "bd/io/arch.hpp"
#include "bd/io/bd_format.hpp"
#include "bd/io/model_config.hpp"
#include "bd/io/model_folder.hpp"
#include "bd/nn/attention_config.hpp"
#include "bd/nn/llama.hpp"
#include "bd/nn/multi_head_attention.hpp"

namespace bd::io {

/// A part of a source tensor that stays dense under a new name: the given rows (axis 0) or
/// columns (axis 1) of the stored tensor, in its stored dtype and orientation.
struct KeptPart {
  std::string name, source;
  int axis = 0;
  std::vector<Eigen::Index> indices;
};

/// One attention layer as the checkpoint stores it, and what converting it touches. Built from
/// config.json and the tensor headers alone (every shape and dtype checked); `load` reads the
/// weights, so a converter holds one layer's weights at a time.
struct AttentionLayout {
  std::string prefix;  ///< P
  nn::AttentionConfig config;
  std::vector<std::string> qk_sources, vo_sources;  ///< tensors consumed by QK, by VO (may overlap)
  std::vector<KeptPart> keep_without_vo;            ///< kept when QK is converted and VO is not
  std::vector<KeptPart> keep_without_qk;            ///< kept when VO is converted and QK is not
  std::vector<KeptPart> keep_with_qk;               ///< kept whenever QK is converted
  /// MLA: the tensors that produce the latent's channels (kv_a_proj_with_mqa: the latent's rows,
  /// then the RoPE key's; kv_a_layernorm), whole; a conversion with the latent window last
  /// (ConvertOptions::latent_window_last) writes them with the latent rows reordered.
  std::vector<KeptPart> latent_parts;
  Eigen::Index d_q = 0, d_kv = 0, d_out = 0;        ///< widths of the query input, key/value input, output
  bool query_bias = false, value_or_output_bias = false;
  /// The weights the QK and VO products need (x·W orientation, double); reads the folder.
  std::function<nn::AttentionWeights<double>()> load;
};

namespace detail {

using bd::detail::message;

inline std::vector<Eigen::Index> range(Eigen::Index begin, Eigen::Index end) {
  std::vector<Eigen::Index> out;
  for (Eigen::Index i = begin; i < end; ++i) out.push_back(i);
  return out;
}

/// Finds the prefix before `suffix` among the tensor names ("transformer." in "transformer.h.0…").
inline std::string find_prefix(const ModelFolder& m, const std::string& suffix, const std::string& what) {
  for (const auto& shard : m.shards())
  for (const auto& t : shard.tensors.tensors()) {
    if (t.name.size() >= suffix.size() && t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return t.name.substr(0, t.name.size() - suffix.size());
  }
  throw FormatError(message(m.dir(), ": no tensor ending in '", suffix, "': not a ", what, " checkpoint"));
}

/// Whether a tensor exists and, if it does, that it is a weight of the given shape.
inline bool optional_weight(const ModelFolder& m, const std::string& name, Eigen::Index rows, Eigen::Index cols) {
  if (!m.contains(name)) return false;
  m.require_weight(name, rows, cols);
  return true;
}

inline Eigen::VectorXd vector(const ModelFolder& m, const std::string& name, Eigen::Index n) { return m.matrix(name, n, 1); }

/// What stays dense in a converted GPT-2 layer: the kept slice of c_attn and, under QK, c_proj.
BD_DEFERRED void gpt2_converted(const ModelFolder& m, AttentionLayout& a, nn::Mode mode, Eigen::Index d) {
  const std::string proj = a.prefix + ".c_proj";
  if (mode == nn::Mode::QKVO) {
    a.load = [] { return nn::AttentionWeights<double>{}; };
    return;
  }
  const bool qk = nn::has_qk(mode);  // QK converted: V and the output stay
  const std::string kept = a.prefix + (qk ? ".c_attn_v" : ".c_attn_qk");
  const Eigen::Index width = qk ? d : 2 * d;
  m.require_weight(kept + ".weight", d, width);
  const bool bias = optional_weight(m, kept + ".bias", width, 1);
  const bool proj_bias = qk && optional_weight(m, proj + ".bias", d, 1);
  if (qk) m.require_weight(proj + ".weight", d, d);
  a.load = [&m, kept, proj, d, qk, bias, proj_bias] {
    nn::AttentionWeights<double> w;
    const Eigen::MatrixXd W = m.matrix(kept + ".weight", d, qk ? d : 2 * d);
    const Eigen::VectorXd b = bias ? vector(m, kept + ".bias", qk ? d : 2 * d) : Eigen::VectorXd();
    if (qk) {
      w.Wv = W;
      w.Wo = m.matrix(proj + ".weight", d, d);
      if (bias) w.bv = b;
      if (proj_bias) w.bo = vector(m, proj + ".bias", d);
    } else {
      w.Wq = W.leftCols(d);
      w.Wk = W.rightCols(d);
      if (bias) {
        w.bq = b.head(d);
        w.bk = b.tail(d);
      }
    }
    return w;
  };
}

BD_DEFERRED std::vector<AttentionLayout> gpt2_layers(const ModelFolder& m, std::optional<nn::Mode> converted) {
  const nlohmann::json& j = m.config();
  const std::string& where = m.config_path();
  const Eigen::Index d = config_int(j, {"n_embd", "hidden_size"}, where);
  const Eigen::Index heads = config_int(j, {"n_head", "num_attention_heads"}, where);
  const Eigen::Index layers = config_int(j, {"n_layer", "num_hidden_layers"}, where);
  const std::string pre = find_prefix(m, converted ? format::marker("h.0.attn", *converted)
                                                  : std::string("h.0.attn.c_attn.weight"),
                                      "gpt2");
  std::vector<AttentionLayout> out;
  for (Eigen::Index l = 0; l < layers; ++l) {
    AttentionLayout a;
    a.prefix = message(pre, "h.", l, ".attn");
    const std::string attn = a.prefix + ".c_attn", proj = a.prefix + ".c_proj";
    a.config.n_q = a.config.n_kv = heads;
    a.config.head_dim = d / heads;
    a.config.causal = true;
    a.d_q = a.d_kv = a.d_out = d;
    if (converted) {
      gpt2_converted(m, a, *converted, d);
      out.push_back(std::move(a));
      continue;
    }
    m.require_weight(attn + ".weight", d, 3 * d);  // Conv1D: [in, out]
    m.require_weight(proj + ".weight", d, d);
    const bool bias = optional_weight(m, attn + ".bias", 3 * d, 1);
    const bool proj_bias = optional_weight(m, proj + ".bias", d, 1);
    a.query_bias = bias;
    a.value_or_output_bias = bias || proj_bias;
    a.load = [&m, attn, proj, d, bias, proj_bias] {
      nn::AttentionWeights<double> w;
      const Eigen::MatrixXd W = m.matrix(attn + ".weight", d, 3 * d);
      w.Wq = W.leftCols(d);
      w.Wk = W.middleCols(d, d);
      w.Wv = W.rightCols(d);
      if (bias) {
        const Eigen::VectorXd b = vector(m, attn + ".bias", 3 * d);
        w.bq = b.head(d);
        w.bk = b.segment(d, d);
        w.bv = b.tail(d);
      }
      w.Wo = m.matrix(proj + ".weight", d, d);
      if (proj_bias) w.bo = vector(m, proj + ".bias", d);
      return w;
    };
    a.qk_sources = {attn + ".weight"};
    a.vo_sources = {attn + ".weight", proj + ".weight"};
    if (bias) {
      a.qk_sources.push_back(attn + ".bias");
      a.vo_sources.push_back(attn + ".bias");
    }
    if (proj_bias) a.vo_sources.push_back(proj + ".bias");
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

/// Layers whose four projections are separate nn.Linear tensors [out, in] with optional biases.
/// `converted`: the layout of a BD checkpoint converted in that mode, whose `load` reads what
/// stayed dense (the products' own tensors are gone).
BD_DEFERRED AttentionLayout linear_layout(const ModelFolder& m, std::string prefix, nn::AttentionConfig config,
                                     const std::string& q, const std::string& k, const std::string& v, const std::string& o,
                                     Eigen::Index d, std::optional<nn::Mode> converted) {
  AttentionLayout a;
  a.prefix = std::move(prefix);
  a.config = config;
  const Eigen::Index dq = config.n_q * config.head_dim, dkv = config.n_kv * config.head_dim;
  a.d_q = a.d_kv = a.d_out = d;
  struct Part {
    std::string name;
    Eigen::Index out;
  };
  const Part parts[] = {{q, dq}, {k, dkv}, {v, dkv}, {o, d}};
  const bool qk_gone = converted && nn::has_qk(*converted), vo_gone = converted && nn::has_vo(*converted);
  bool bias[4] = {false, false, false, false}, present[4];
  for (int i = 0; i < 4; ++i) {
    present[i] = !(i < 2 ? qk_gone : vo_gone);
    if (!present[i]) continue;
    m.require_weight(parts[i].name + ".weight", parts[i].out, i == 3 ? dq : d);
    bias[i] = optional_weight(m, parts[i].name + ".bias", parts[i].out, 1);
    auto& sources = i < 2 ? a.qk_sources : a.vo_sources;
    sources.push_back(parts[i].name + ".weight");
    if (bias[i]) sources.push_back(parts[i].name + ".bias");
  }
  a.query_bias = bias[0];
  a.value_or_output_bias = bias[2] || bias[3];
  a.load = [&m, q, k, v, o, d, dq, dkv, b = std::vector<bool>(bias, bias + 4), qk = present[0], vo = present[2]] {
    nn::AttentionWeights<double> w;
    if (qk) {
      w.Wq = m.linear(q + ".weight", dq, d);
      w.Wk = m.linear(k + ".weight", dkv, d);
    }
    if (vo) {
      w.Wv = m.linear(v + ".weight", dkv, d);
      w.Wo = m.linear(o + ".weight", d, dq);
    }
    if (b[0]) w.bq = vector(m, q + ".bias", dq);
    if (b[1]) w.bk = vector(m, k + ".bias", dkv);
    if (b[2]) w.bv = vector(m, v + ".bias", dkv);
    if (b[3]) w.bo = vector(m, o + ".bias", d);
    return w;
  };
  return a;
}

BD_DEFERRED std::vector<AttentionLayout> bert_layers(const ModelFolder& m, std::optional<nn::Mode> converted) {
  const nlohmann::json& j = m.config();
  const std::string& where = m.config_path();
  const Eigen::Index d = config_int(j, {"hidden_size"}, where);
  const Eigen::Index heads = config_int(j, {"num_attention_heads"}, where);
  const Eigen::Index layers = config_int(j, {"num_hidden_layers"}, where);
  const std::string pre =
      find_prefix(m, converted && nn::has_qk(*converted) ? format::marker("encoder.layer.0.attention", *converted) : "encoder.layer.0.attention.self.query.weight",
                  "bert");
  std::vector<AttentionLayout> out;
  for (Eigen::Index l = 0; l < layers; ++l) {
    const std::string p = message(pre, "encoder.layer.", l, ".attention");
    nn::AttentionConfig c;
    c.n_q = c.n_kv = heads;
    c.head_dim = d / heads;
    out.push_back(
        linear_layout(m, p, c, p + ".self.query", p + ".self.key", p + ".self.value", p + ".output.dense", d, converted));
  }
  return out;
}

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

/// DeepSeek-V2/V3 (MLA): the whole layer — query LoRA (q_a_proj, q_a_layernorm, q_b_proj) or
/// q_proj, the latent (kv_a_proj_with_mqa: d_c rows, then the shared RoPE key's), its norm,
/// kv_b_proj (per head: nope key rows, then value rows) and o_proj; [out, in], transposed.
/// The config (softmax scale, RoPE scheme, interleaving) as model_config.hpp reads it.
BD_DEFERRED std::vector<AttentionLayout> deepseek_layers(const ModelFolder& m, std::optional<nn::Mode> converted) {
  const DeepSeekConfig c = deepseek_config(m.config(), m.config_path());
  const Eigen::Index d = c.hidden, heads = c.heads, layers = c.layers, kv_lora = c.kv_lora, nope = c.nope, rope = c.rope,
                     dv = c.v_head_dim;
  const bool q_lora = c.q_lora > 0;
  const Eigen::Index d_q = q_lora ? c.q_lora : d;
  // DeepSeek stores each RoPE vector as interleaved pairs and de-interleaves before rotate_half:
  // the same permutation of q_pe's and k_pe's channels leaves every score unchanged, so it is
  // made once here, on the RoPE projections' output columns (the checkpoint keeps its layout).
  const std::vector<Eigen::Index> q_rope_order = c.interleaved ? nn::deinterleaved_rope_columns(heads, rope) : range(0, heads * rope);
  const std::vector<Eigen::Index> k_rope_order = c.interleaved ? nn::deinterleaved_rope_columns(1, rope) : range(0, rope);
  const bool qk_gone = converted && nn::has_qk(*converted), vo_gone = converted && nn::has_vo(*converted);
  std::vector<Eigen::Index> q_nope_rows, q_rope_rows, k_rows, v_rows;
  for (Eigen::Index h = 0; h < heads; ++h) {
    for (Eigen::Index i = 0; i < nope; ++i) q_nope_rows.push_back(h * (nope + rope) + i);
    for (Eigen::Index i = 0; i < rope; ++i) q_rope_rows.push_back(h * (nope + rope) + nope + i);
    for (Eigen::Index i = 0; i < nope; ++i) k_rows.push_back(h * (nope + dv) + i);
    for (Eigen::Index i = 0; i < dv; ++i) v_rows.push_back(h * (nope + dv) + nope + i);
  }
  std::vector<AttentionLayout> out;
  for (Eigen::Index l = 0; l < layers; ++l) {
    AttentionLayout a;
    a.prefix = message("model.layers.", l, ".self_attn");
    const std::string p = a.prefix + ".";
    a.config.n_q = a.config.n_kv = heads;
    a.config.head_dim = nope;
    a.config.v_head_dim = dv;
    a.config.causal = true;
    a.config.scale = c.scale;
    a.config.rope_dim = rope;
    a.config.rope_dim_theta = c.rope_theta;
    a.config.rope_scaling = c.rope_scaling;
    a.config.norm_eps = c.norm_eps;
    a.d_q = d_q;
    a.d_kv = kv_lora;
    a.d_out = d;
    const std::string q_name = p + (q_lora ? "q_b_proj.weight" : "q_proj.weight"), kv_b = p + "kv_b_proj.weight",
                      o = p + "o_proj.weight", q_a = p + "q_a_proj.weight", q_a_norm = p + "q_a_layernorm.weight",
                      kv_a = p + "kv_a_proj_with_mqa.weight", kv_a_norm = p + "kv_a_layernorm.weight",
                      q_rope_kept = p + (q_lora ? "q_b_rope_proj.weight" : "q_rope_proj.weight"),
                      kv_b_v = p + "kv_b_proj_v.weight", kv_b_k = p + "kv_b_proj_k.weight";
    // What this checkpoint holds: the source tensors, or what a conversion kept.
    m.require_weight(kv_a, kv_lora + rope, d);
    const bool latent_norm = optional_weight(m, kv_a_norm, kv_lora, 1);
    const bool q_norm = q_lora && optional_weight(m, q_a_norm, d_q, 1);
    if (q_lora) m.require_weight(q_a, d_q, d);
    m.require_weight(qk_gone ? q_rope_kept : q_name, heads * (qk_gone ? rope : nope + rope), d_q);
    if (!qk_gone && !vo_gone) m.require_weight(kv_b, heads * (nope + dv), kv_lora);
    if (qk_gone && !vo_gone) m.require_weight(kv_b_v, heads * dv, kv_lora);
    if (!qk_gone && vo_gone) m.require_weight(kv_b_k, heads * nope, kv_lora);
    if (!vo_gone) m.require_weight(o, d, heads * dv);
    a.load = [=, &m] {
      nn::AttentionWeights<double> w;
      const Eigen::MatrixXd latent = m.linear(kv_a, kv_lora + rope, d);  // d × (d_c + rope)
      w.W_dkv = latent.leftCols(kv_lora);
      w.Wk_rope = latent.rightCols(rope)(Eigen::all, k_rope_order);
      if (latent_norm) w.kv_norm = vector(m, kv_a_norm, kv_lora);
      if (q_lora) {
        w.W_qa = m.linear(q_a, d_q, d);  // d × q_lora
        if (q_norm) w.q_norm = vector(m, q_a_norm, d_q);
      }
      if (qk_gone) {
        w.Wq_rope = m.linear(q_rope_kept, heads * rope, d_q)(Eigen::all, q_rope_order);
      } else {
        const Eigen::MatrixXd q = m.linear(q_name, heads * (nope + rope), d_q);  // d_q × n·(nope + rope)
        w.Wq = q(Eigen::all, q_nope_rows);       // d_q × n·nope
        w.Wq_rope = Eigen::MatrixXd(q(Eigen::all, q_rope_rows))(Eigen::all, q_rope_order);  // d_q × n·rope
      }
      if (!qk_gone && !vo_gone) {
        const Eigen::MatrixXd kv = m.linear(kv_b, heads * (nope + dv), kv_lora);  // d_c × n·(nope + dv)
        w.Wk = kv(Eigen::all, k_rows);  // W_uk
        w.Wv = kv(Eigen::all, v_rows);  // W_uv
      } else if (qk_gone && !vo_gone) {
        w.Wv = m.linear(kv_b_v, heads * dv, kv_lora);
      } else if (!qk_gone && vo_gone) {
        w.Wk = m.linear(kv_b_k, heads * nope, kv_lora);
      }
      if (!vo_gone) w.Wo = m.linear(o, d, heads * dv);  // n·dv × d
      return w;
    };
    a.qk_sources = {q_name, kv_b};
    a.vo_sources = {kv_b, o};
    a.keep_with_qk.push_back({q_rope_kept, q_name, 0, q_rope_rows});
    a.keep_without_vo.push_back({kv_b_v, kv_b, 0, v_rows});
    a.keep_without_qk.push_back({kv_b_k, kv_b, 0, k_rows});
    a.latent_parts.push_back({kv_a, kv_a, 0, range(0, kv_lora + rope)});
    if (latent_norm) a.latent_parts.push_back({kv_a_norm, kv_a_norm, 0, range(0, kv_lora)});
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace detail

/// Every attention layer of a checkpoint of the given architecture (headers only; see `load`).
/// With `converted`, the layers of a BD checkpoint converted in that mode, whose `load` gives
/// what stayed dense. The layouts refer to `folder`, which must outlive them.
BD_DEFERRED std::vector<AttentionLayout> attention_layers(Arch arch, const ModelFolder& folder,
                                                     std::optional<nn::Mode> converted = std::nullopt) {
  switch (arch) {
    case Arch::GPT2: return detail::gpt2_layers(folder, converted);
    case Arch::BERT: return detail::bert_layers(folder, converted);
    case Arch::LLaMA: return detail::llama_layers(folder, converted);
    case Arch::DeepSeekV2: return detail::deepseek_layers(folder, converted);
  }
  return {};
}

/// Attention layer `layer` (0-based) of a model folder (or file) as a dense layer, weights
/// rounded once to S, reading that layer's tensors only: a large model checked layer by layer.
template <typename S = double>
nn::MultiHeadAttention<S> load_attention_layer(const std::string& path, Arch arch, std::size_t layer) {
  const ModelFolder m = ModelFolder::open(path);
  const std::vector<AttentionLayout> layers = attention_layers(arch, m);
  if (layer >= layers.size())
    throw RangeError(bd::detail::message(path, ": layer ", layer, " requested, the checkpoint has ", layers.size()));
  return nn::MultiHeadAttention<S>(layers[layer].config, layers[layer].load().template cast<S>());
}

/// Every attention layer of a model folder (or file) as a dense layer, weights rounded once to
/// S: the reference a converted or BD-prepared layer is checked against.
template <typename S = double>
std::vector<nn::MultiHeadAttention<S>> load_attention(const std::string& path, Arch arch) {
  const ModelFolder m = ModelFolder::open(path);
  std::vector<nn::MultiHeadAttention<S>> out;
  for (const AttentionLayout& a : attention_layers(arch, m)) out.emplace_back(a.config, a.load().template cast<S>());
  return out;
}

/// The instantiations bd::compiled holds where bd::io is built (src/compiled_io.cpp), extern under
/// BD_COMPILED_IO.
#define BD_CHECKPOINT_INSTANTIATIONS(prefix)                                                                            \
  prefix void detail::gpt2_converted<>(const ModelFolder&, AttentionLayout&, nn::Mode, Eigen::Index);                  \
  prefix std::vector<AttentionLayout> detail::gpt2_layers<>(const ModelFolder&, std::optional<nn::Mode>);               \
  prefix AttentionLayout detail::linear_layout<>(const ModelFolder&, std::string, nn::AttentionConfig, const std::string&, \
                                                 const std::string&, const std::string&, const std::string&, Eigen::Index, \
                                                 std::optional<nn::Mode>);                                             \
  prefix std::vector<AttentionLayout> detail::bert_layers<>(const ModelFolder&, std::optional<nn::Mode>);               \
  prefix std::vector<AttentionLayout> detail::llama_layers<>(const ModelFolder&, std::optional<nn::Mode>);              \
  prefix std::vector<AttentionLayout> detail::deepseek_layers<>(const ModelFolder&, std::optional<nn::Mode>);           \
  prefix std::vector<AttentionLayout> attention_layers<>(Arch, const ModelFolder&, std::optional<nn::Mode>);
#ifdef BD_COMPILED_IO
BD_CHECKPOINT_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::io
