// bd/io/bert.hpp — BERT checkpoints: the attention layers, read and converted.
//
//   P = …encoder.layer.{l}.attention   self.{query,key,value}, output.dense (nn.Linear [out, in]) + biases
//
// config.json: hidden_size, num_attention_heads, num_hidden_layers.
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

}  // namespace detail

/// The instantiations bd::compiled holds (src/compiled_io.cpp), extern under BD_COMPILED_LIB.
#define BD_BERT_INSTANTIATIONS(prefix) \
  prefix std::vector<AttentionLayout> detail::bert_layers<>(const ModelFolder&, std::optional<nn::Mode>);
#ifdef BD_COMPILED_LIB
BD_BERT_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::io
