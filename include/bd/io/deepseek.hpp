// bd/io/deepseek.hpp — DeepSeek-V2/V3 (model_type deepseek_v2, deepseek_v3): config.json read as
// DeepSeek's modeling_deepseek.py reads it, and each layer's multi-head latent attention.
//
//   P = model.layers.{l}.self_attn   q_proj (or q_a_proj/q_a_layernorm/q_b_proj),
//   kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj (per head: k_nope rows, then v rows), o_proj
//   (read as the whole MLA layer: query LoRA, latent, decoupled RoPE)
//   kept: P.q_rope_proj.weight / P.q_b_rope_proj.weight (the RoPE rows of the query projection,
//   qk), P.kv_b_proj_v.weight (qk only), P.kv_b_proj_k.weight (vo only)
//
// RoPE on the decoupled channels, stored interleaved (rope_interleave, default true);
// rope_scaling type yarn (also linear, dynamic): original_max_position_embeddings (4096),
// beta_fast 32, beta_slow 1, cos/sin scaled by mscale(factor, mscale)/mscale(factor,
// mscale_all_dim) with mscale 1, mscale_all_dim 0 by default; the softmax scale multiplied by
// mscale(factor, mscale_all_dim)² when mscale_all_dim is set.
#pragma once

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <Eigen/Core>
#include <nlohmann/json.hpp>

#include "bd/base/error.hpp"
#include "bd/io/attention_layout.hpp"
#include "bd/io/model_config.hpp"
#include "bd/io/model_folder.hpp"
#include "bd/nn/rope.hpp"

namespace bd::io {

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

namespace detail {

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

/// The instantiations bd::compiled holds (src/compiled_io.cpp), extern under BD_COMPILED_LIB.
#define BD_DEEPSEEK_INSTANTIATIONS(prefix) \
  prefix std::vector<AttentionLayout> detail::deepseek_layers<>(const ModelFolder&, std::optional<nn::Mode>);
#ifdef BD_COMPILED_LIB
BD_DEEPSEEK_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::io
