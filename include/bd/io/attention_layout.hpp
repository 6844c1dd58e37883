// bd/io/attention_layout.hpp — one attention layer as a Hugging Face checkpoint stores it: where
// its weights live, what a conversion consumes and keeps, and the reading of a layer whose four
// projections are separate nn.Linear tensors (BERT, the LLaMA family). Each model family's file
// (gpt2.hpp, bert.hpp, llama.hpp, deepseek.hpp) builds its layers from these; checkpoint.hpp
// chooses the family.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "bd/base/deferred.hpp"
#include "bd/base/error.hpp"
#include "bd/io/model_folder.hpp"
#include "bd/nn/attention_config.hpp"
#include "bd/nn/bd_mode.hpp"

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

}  // namespace detail

/// The instantiations bd::compiled holds (src/compiled_io.cpp), extern under BD_COMPILED_LIB.
#define BD_ATTENTION_LAYOUT_INSTANTIATIONS(prefix)                                                                       \
  prefix AttentionLayout detail::linear_layout<>(const ModelFolder&, std::string, nn::AttentionConfig, const std::string&, \
                                                 const std::string&, const std::string&, const std::string&, Eigen::Index, \
                                                 std::optional<nn::Mode>);
#ifdef BD_COMPILED_LIB
BD_ATTENTION_LAYOUT_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::io
