// A synthetic Hugging Face checkpoint folder at real scale, written shard by shard without
// holding more than one tensor in memory: DeepSeek-V2-Lite's attention (27 layers, hidden 2048,
// 16 heads, latent 512, nope 128, rope 64, v 128, no query LoRA) with a dense SwiGLU MLP of
// width 5632 in place of the MoE, a 102400-token vocabulary and an untied head: 3.45 GB in bf16.
// Values are uniform in ±1/√fan_in (full-rank products, the hard case for BD's error), seeded.
// Every size is a member: `small()` is a few-MB stand-in for tests, q_lora > 0 gives V3's
// query LoRA (q_a_proj, q_a_layernorm, q_b_proj) instead of q_proj.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <Eigen/Core>
#include <nlohmann/json.hpp>

#include <bd/io/safetensors.hpp>
#include <bd/io/safetensors_writer.hpp>

namespace bd_bench {

struct SyntheticCheckpoint {
  int layers = 27, hidden = 2048, heads = 16, latent = 512, nope = 128, rope = 64, v = 128, mlp = 5632, vocab = 102400;
  int q_lora = 0;
  int shards = 4;
  std::uint64_t seed = 1;

  /// DeepSeek-V3's attention at full size (hidden 7168, 128 heads, query LoRA 1536, latent 512,
  /// nope 128, rope 64, v 128) with a token MLP and vocabulary: 374 MB of bf16 per layer.
  static SyntheticCheckpoint v3(int layer_count) {
    SyntheticCheckpoint c;
    c.layers = layer_count;
    c.hidden = 7168;
    c.heads = 128;
    c.q_lora = 1536;
    c.mlp = 64;
    c.vocab = 512;
    c.shards = 1;
    return c;
  }

  /// A few MB with the same structure (tests, examples).
  static SyntheticCheckpoint small(int q_lora_rank = 0) {
    SyntheticCheckpoint c;
    c.layers = 3;
    c.hidden = 128;
    c.heads = 4;
    c.latent = 64;
    c.nope = 16;
    c.rope = 8;
    c.v = 16;
    c.mlp = 96;
    c.vocab = 256;
    c.q_lora = q_lora_rank;
    c.shards = 2;
    return c;
  }

  /// Tensors in file order; shard s holds layers [s·L/S, (s+1)·L/S), the embedding goes first, the head last.
  std::vector<std::vector<bd::io::TensorSpec>> plan() const {
    using bd::io::DType;
    auto W = [](std::string name, std::int64_t rows, std::int64_t cols) {
      return bd::io::TensorSpec{std::move(name), DType::BF16, {rows, cols}};
    };
    auto N = [](std::string name, std::int64_t n) { return bd::io::TensorSpec{std::move(name), DType::BF16, {n}}; };
    std::vector<std::vector<bd::io::TensorSpec>> out(static_cast<std::size_t>(shards));
    out.front().push_back(W("model.embed_tokens.weight", vocab, hidden));
    for (int l = 0; l < layers; ++l) {
      auto& s = out[static_cast<std::size_t>(l * shards / layers)];
      const std::string p = "model.layers." + std::to_string(l) + ".";
      s.push_back(N(p + "input_layernorm.weight", hidden));
      if (q_lora) {
        s.push_back(W(p + "self_attn.q_a_proj.weight", q_lora, hidden));
        s.push_back(N(p + "self_attn.q_a_layernorm.weight", q_lora));
        s.push_back(W(p + "self_attn.q_b_proj.weight", heads * (nope + rope), q_lora));
      } else {
        s.push_back(W(p + "self_attn.q_proj.weight", heads * (nope + rope), hidden));
      }
      s.push_back(W(p + "self_attn.kv_a_proj_with_mqa.weight", latent + rope, hidden));
      s.push_back(N(p + "self_attn.kv_a_layernorm.weight", latent));
      s.push_back(W(p + "self_attn.kv_b_proj.weight", heads * (nope + v), latent));
      s.push_back(W(p + "self_attn.o_proj.weight", hidden, heads * v));
      s.push_back(N(p + "post_attention_layernorm.weight", hidden));
      s.push_back(W(p + "mlp.gate_proj.weight", mlp, hidden));
      s.push_back(W(p + "mlp.up_proj.weight", mlp, hidden));
      s.push_back(W(p + "mlp.down_proj.weight", hidden, mlp));
    }
    out.back().push_back(N("model.norm.weight", hidden));
    out.back().push_back(W("lm_head.weight", vocab, hidden));
    return out;
  }

  static std::string shard_name(int s, int shards) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", s + 1, shards);
    return buf;
  }

  /// Writes config.json, the shards and model.safetensors.index.json into `dir` (created).
  /// Returns the bytes of tensor data written.
  std::uint64_t write(const std::string& dir) const {
    namespace fs = std::filesystem;
    fs::create_directories(dir);
    nlohmann::ordered_json config = nlohmann::ordered_json{{"architectures", {"DeepseekV2ForCausalLM"}},
                                     {"model_type", "deepseek_v2"},
                                     {"hidden_size", hidden},
                                     {"intermediate_size", mlp},
                                     {"num_hidden_layers", layers},
                                     {"num_attention_heads", heads},
                                     {"num_key_value_heads", heads},
                                     {"kv_lora_rank", latent},
                                     {"q_lora_rank", q_lora ? nlohmann::json(q_lora) : nlohmann::json(nullptr)},
                                     {"qk_nope_head_dim", nope},
                                     {"qk_rope_head_dim", rope},
                                     {"v_head_dim", v},
                                     {"vocab_size", vocab},
                                     {"torch_dtype", "bfloat16"}};
    std::ofstream(dir + "/config.json") << config.dump(2) << "\n";
    nlohmann::ordered_json map = nlohmann::ordered_json::object();
    std::uint64_t total = 0, state = seed * 0x9E3779B97F4A7C15ull + 1;
    const auto files = plan();
    for (int s = 0; s < shards; ++s) {
      const std::string name = shard_name(s, shards);
      bd::io::FileWriter w(dir + "/" + name, files[static_cast<std::size_t>(s)], {{"format", "pt"}});
      for (const auto& t : files[static_cast<std::size_t>(s)]) {
        map[t.name] = name;
        const std::size_t n = t.bytes() / 2;
        std::vector<std::uint16_t> values(n);
        const bool norm = t.shape.size() == 1;
        const float a = norm ? 0.f : 1.0f / std::sqrt(float(t.shape[1]));
        for (auto& x : values) {
          state ^= state << 13, state ^= state >> 7, state ^= state << 17;  // xorshift64
          const float u = norm ? 1.0f : a * (float(state >> 40) * (2.0f / 16777216.0f) - 1.0f);
          std::uint32_t bits;
          std::memcpy(&bits, &u, 4);
          x = static_cast<std::uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);  // round to nearest even
        }
        w.write(t.name, values.data(), t.bytes());
        total += t.bytes();
      }
      w.commit();
    }
    std::ofstream(dir + "/model.safetensors.index.json")
        << nlohmann::ordered_json{{"metadata", {{"total_size", total}}}, {"weight_map", map}}.dump(2) << "\n";
    return total;
  }
};

}  // namespace bd_bench
