// bd/io/gpt2.hpp — GPT-2 checkpoints: the attention layers, read and converted.
//
//   P = h.{l}.attn   c_attn [d, 3d] (Conv1D [in, out], q|k|v) + bias, c_proj [d, d] + bias
//   kept: P.c_attn_v.{weight,bias} (qk only), P.c_attn_qk.{weight,bias} (vo only)
//
// config.json: n_embd (or hidden_size), n_head (num_attention_heads), n_layer (num_hidden_layers).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <Eigen/Core>
#include <nlohmann/json.hpp>

#include "bd/io/attention_layout.hpp"
#include "bd/io/bd_format.hpp"
#include "bd/io/model_folder.hpp"

namespace bd::io {

namespace detail {

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

}  // namespace detail

/// The instantiations bd::compiled holds (src/compiled_io.cpp), extern under BD_COMPILED_LIB.
#define BD_GPT2_INSTANTIATIONS(prefix) \
  prefix void detail::gpt2_converted<>(const ModelFolder&, AttentionLayout&, nn::Mode, Eigen::Index); \
  prefix std::vector<AttentionLayout> detail::gpt2_layers<>(const ModelFolder&, std::optional<nn::Mode>);
#ifdef BD_COMPILED_LIB
BD_GPT2_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::io
