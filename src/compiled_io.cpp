// bd::compiled — bd::io's heavy functions: the checkpoint layouts of every model family, the
// conversion, BD checkpoints' indices. Headers declare them extern under BD_COMPILED_LIB.
#include <bd/io/bd_checkpoint.hpp>
#include <bd/io/checkpoint.hpp>
#include <bd/io/convert.hpp>

namespace bd::io {
BD_ATTENTION_LAYOUT_INSTANTIATIONS(template)
BD_GPT2_INSTANTIATIONS(template)
BD_BERT_INSTANTIATIONS(template)
BD_LLAMA_INSTANTIATIONS(template)
BD_DEEPSEEK_INSTANTIATIONS(template)
BD_CHECKPOINT_INSTANTIATIONS(template)
BD_CONVERT_INSTANTIATIONS(template)
BD_BD_CHECKPOINT_INSTANTIATIONS(template)
}  // namespace bd::io
