// bd/io/arch.hpp — the model architectures bd reads from Hugging Face checkpoints, by name.
#pragma once

#include <string>

#include "bd/base/error.hpp"
#include "bd/base/names.hpp"

namespace bd::io {

enum class Arch { GPT2, BERT, LLaMA, DeepSeekV2 };

inline constexpr bd::detail::Named<Arch> arch_names[] = {
    {Arch::GPT2, "gpt2"}, {Arch::BERT, "bert"}, {Arch::LLaMA, "llama"}, {Arch::DeepSeekV2, "deepseek-v2"}};

inline const char* to_string(Arch a) { return bd::detail::name_in(arch_names, a); }
inline Arch parse_arch(const std::string& s) { return bd::detail::parse_in(arch_names, s, "architecture"); }

}  // namespace bd::io
