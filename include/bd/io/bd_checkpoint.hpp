// bd/io/bd_checkpoint.hpp — reads what bd-convert writes (format v1, bd/io/bd_format.hpp)
// back into bd::nn: each attention layer as a BDAttention, or a whole LLaMA model with BD
// attention. The checkpoint is a folder (config.json with a "bd" record, one file or shards) or
// a single .safetensors file with the model's config.json beside it. The file's bd.format must
// be 1, and every tensor's presence, dtype and shape is checked against config.json.
//
// Layers of every layout bd-convert writes are read back: GPT-2, BERT, LLaMA, and DeepSeek-V2/V3
// as whole MLA layers (query LoRA, latent, decoupled RoPE) that prefill and decode absorbed over
// a LatentCache.
#pragma once

#include <string>
#include <vector>

#include "bd/base/deferred.hpp"
#include "bd/core/scalar.hpp"
#include "bd/io/bd_format.hpp"
#include "bd/io/checkpoint.hpp"
#include "bd/io/llama.hpp"
#include "bd/io/model_folder.hpp"
#include "bd/nn/bd_attention.hpp"

namespace bd::io {

/// The options a BD checkpoint was converted with, as its metadata records them (bd/io/bd_format.hpp).
inline ConvertOptions recorded_options(const ModelFolder& m) { return format::options_from(m.metadata(), m.dir()); }

namespace detail {

/// The channel indices of a family: an I32 tensor [heads, dim], ascending per head, heads either
/// of `heads_options` (n_q: a window per query head; n_kv: per key/value group).
BD_DEFERRED nn::HeadIndices stored_indices(const ModelFolder& m, const std::string& name,
                                           std::pair<Eigen::Index, Eigen::Index> heads_options, Eigen::Index dim, Eigen::Index input_dim) {
  const TensorInfo& t = m.info(name);
  if (t.dtype != DType::I32 || t.shape.size() != 2 || (t.shape[0] != heads_options.first && t.shape[0] != heads_options.second) ||
      t.shape[1] != dim)
    throw FormatError(message(m.file_of(name).source(), ": tensor '", name, "' is ", to_string(t.dtype), " of ", t.shape.size(),
                              " dimensions, expected I32 [", heads_options.first, " (per query head) or ", heads_options.second,
                              " (per key/value group), ", dim, "]"));
  const Eigen::Index heads = t.shape[0];
  const std::vector<std::int64_t> v = m.file_of(name).values<std::int64_t>(name);
  std::vector<std::vector<Eigen::Index>> basis(static_cast<std::size_t>(heads));
  for (Eigen::Index h = 0; h < heads; ++h)
    basis[static_cast<std::size_t>(h)].assign(v.begin() + h * dim, v.begin() + (h + 1) * dim);
  try {
    return nn::HeadIndices::from_basis(std::move(basis), input_dim);
  } catch (const Error& e) {
    throw FormatError(message(m.file_of(name).source(), ": tensor '", name, "': ", e.what()));
  }
}

template <typename S>
Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic> stored(const ModelFolder& m, const std::string& name, Eigen::Index rows,
                                                         Eigen::Index cols) {
  return round_matrix<S>(m.matrix(name, rows, cols));  // exact when the file holds S
}

/// One layer of a BD checkpoint.
template <typename S>
nn::BDAttention<S> read_bd_layer(const ModelFolder& m, const AttentionLayout& a, nn::Mode mode) {
  const std::string& P = a.prefix;
  const Eigen::Index n = a.config.n_q, dh = a.config.head_dim, dv = a.config.value_dim();
  const std::pair<Eigen::Index, Eigen::Index> heads{n, a.config.n_kv};
  nn::BDWeights<S> w;
  if (nn::has_qk(mode)) {
    const format::TensorNames t = format::tensor_names(P, format::Family::QK);
    w.qk_basis = stored<S>(m, t.basis, a.d_q, n * dh);
    w.qk_indices = stored_indices(m, t.indices, heads, dh, a.d_kv);
    w.qk_coeff = stored<S>(m, t.coeff, a.d_kv - dh, w.qk_indices.heads() * dh);
    if (m.contains(t.bias)) w.qk_bias = stored<S>(m, t.bias, n * dh, 1);
  }
  if (nn::has_vo(mode)) {
    const format::TensorNames t = format::tensor_names(P, format::Family::VO);
    w.vo_indices = stored_indices(m, t.indices, heads, dv, a.d_kv);
    w.vo_coeff = stored<S>(m, t.coeff, a.d_kv - dv, w.vo_indices.heads() * dv);
    w.vo_basis = stored<S>(m, t.basis, n * dv, a.d_out);
    if (m.contains(t.bias)) w.vo_bias = stored<S>(m, t.bias, a.d_out, 1);
  }
  return nn::BDAttention<S>::assemble(a.config, mode, a.load().template cast<S>(), std::move(w));
}

}  // namespace detail

/// Every attention layer of a BD checkpoint, weights stored in S.
template <typename S = float>
std::vector<nn::BDAttention<S>> load_bd_attention(const std::string& path) {
  const ModelFolder m = ModelFolder::open(path);
  const ConvertOptions r = recorded_options(m);
  std::vector<nn::BDAttention<S>> out;
  for (const AttentionLayout& a : attention_layers(r.arch, m, r.mode)) out.push_back(detail::read_bd_layer<S>(m, a, r.mode));
  return out;
}

/// Attention layer `layer` (0-based) of a BD checkpoint, weights stored in S, reading that
/// layer's tensors only.
template <typename S = float>
nn::BDAttention<S> load_bd_attention_layer(const std::string& path, std::size_t layer) {
  const ModelFolder m = ModelFolder::open(path);
  const ConvertOptions r = recorded_options(m);
  const std::vector<AttentionLayout> layers = attention_layers(r.arch, m, r.mode);
  if (layer >= layers.size())
    throw RangeError(bd::detail::message(path, ": layer ", layer, " requested, the checkpoint has ", layers.size()));
  return detail::read_bd_layer<S>(m, layers[layer], r.mode);
}

/// A LLaMA model with BD attention from a checkpoint bd-convert wrote (--arch llama).
template <typename S = float>
nn::LlamaModel<S, nn::BDAttention<S>> load_bd_llama(const std::string& path) {
  const ModelFolder m = ModelFolder::open(path);
  const ConvertOptions r = recorded_options(m);
  if (r.arch != Arch::LLaMA)
    throw FormatError(bd::detail::message(m.dir(), ": bd.arch is ", to_string(r.arch), ", expected llama"));
  const std::vector<AttentionLayout> layouts = attention_layers(Arch::LLaMA, m, r.mode);
  return detail::llama_model<S, nn::BDAttention<S>>(
      m, [&](Eigen::Index l) { return detail::read_bd_layer<S>(m, layouts[static_cast<std::size_t>(l)], r.mode); });
}

/// Whether `path` holds a BD checkpoint (its metadata has bd.format).
inline bool is_bd_checkpoint(const std::string& path) {
  const ModelFolder m = ModelFolder::open(path);
  return format::has_record(m.metadata());
}

/// The instantiation bd::compiled holds (src/compiled_io.cpp), extern under BD_COMPILED_LIB.
#define BD_BD_CHECKPOINT_INSTANTIATIONS(prefix) \
  prefix nn::HeadIndices detail::stored_indices<>(const ModelFolder&, const std::string&, std::pair<Eigen::Index, Eigen::Index>, \
                                                  Eigen::Index, Eigen::Index);
#ifdef BD_COMPILED_LIB
BD_BD_CHECKPOINT_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::io
