// bd/io/arch.hpp — the model architectures bd reads from Hugging Face checkpoints, by name.
#pragma once

#include <string>

#include "bd/base/error.hpp"

namespace bd::io {

enum class Arch { GPT2, BERT, LLaMA, DeepSeekV2 };

inline const char* to_string(Arch a) {
  switch (a) {
    case Arch::GPT2: return "gpt2";
    case Arch::BERT: return "bert";
    case Arch::LLaMA: return "llama";
    case Arch::DeepSeekV2: return "deepseek-v2";
  }
  return "?";
}

inline Arch parse_arch(const std::string& s) {
  for (Arch a : {Arch::GPT2, Arch::BERT, Arch::LLaMA, Arch::DeepSeekV2})
    if (s == to_string(a)) return a;
  throw RangeError("unknown architecture '" + s + "': expected gpt2, bert, llama or deepseek-v2");
}

}  // namespace bd::io
