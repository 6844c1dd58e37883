// bd/io/checkpoint.hpp — the attention layers of a Hugging Face checkpoint, whichever family it
// is: the family's file (gpt2.hpp, bert.hpp, llama.hpp, deepseek.hpp — config reading, tensor
// names and layer assembly together) reads them into bd::nn weights (x·W orientation, double)
// with what a conversion consumes and keeps (attention_layout.hpp). A new family is a file of its
// own, an enumerator and name in arch.hpp, and a case below.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "bd/base/deferred.hpp"
#include "bd/base/error.hpp"
#include "bd/io/arch.hpp"
#include "bd/io/attention_layout.hpp"
#include "bd/io/bert.hpp"
#include "bd/io/deepseek.hpp"
#include "bd/io/gpt2.hpp"
#include "bd/io/llama.hpp"
#include "bd/io/model_folder.hpp"
#include "bd/nn/multi_head_attention.hpp"

namespace bd::io {

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

/// The instantiation bd::compiled holds (src/compiled_io.cpp), extern under BD_COMPILED_LIB.
#define BD_CHECKPOINT_INSTANTIATIONS(prefix) \
  prefix std::vector<AttentionLayout> attention_layers<>(Arch, const ModelFolder&, std::optional<nn::Mode>);
#ifdef BD_COMPILED_LIB
BD_CHECKPOINT_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::io
