// bd::compiled — the LLaMA decoder's forward (LlamaModel::run, behind logits() and decode()) for
// the models the loaders build, dense and with BD attention, for every stored type
// (nn/llama.hpp lists them).
#include <bd/nn/llama.hpp>

namespace bd::nn {
BD_LLAMA_MODEL_INSTANTIATIONS(template)
}  // namespace bd::nn
