// bd::compiled — the attention layers: the algorithm's members (forward, decoding, prefill,
// absorbed decoding, backward) of the dense and BD layers, and BD preparation's entry, for every
// stored type (nn/multi_head_attention.hpp and nn/bd_attention.hpp list them).
#include <bd/nn/bd_attention.hpp>
#include <bd/nn/multi_head_attention.hpp>

namespace bd::nn {
BD_MULTI_HEAD_ATTENTION_INSTANTIATIONS(template)
BD_BD_ATTENTION_INSTANTIATIONS(template)
}  // namespace bd::nn
