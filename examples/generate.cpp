// A real model writing text, dense and BD side by side: loads a LLaMA-family folder with
// llama2.c's tokenizer (by default the stories260K that ships with bd), prepares BD on the chosen
// products in memory, and generates greedily from a prompt with the KV cache — the dense model in
// fp32, the BD model stored in the chosen type, both computing in the chosen arithmetic (f32, or
// bf16: every projection's operands rounded once to bfloat16). Prints both texts, whether their
// token ids agree, tokens/s of each, and the perplexity of each on a short text; the last line is
// JSON.
//
//   generate [MODEL_DIR] [--prompt TEXT] [--tokens N] [--dtype f32|f16|bf16] [--compute f32|bf16]
//            [--mode vo|qk|qkvo] [--basis B] [--windows per-group|per-head] [--force] [--tokenizer PATH]
//
// The cost model's refusals are bd-convert's. On a GQA model BD chooses one window per key/value
// head by default, so V' and the cache keep the dense model's heads; with --windows per-head each
// query head gets its own V' (more cache, more work), refused unless --force. Exit 1 on any error.
#include <bd/io/llama.hpp>
#include <bd/io/tokenizer.hpp>
#include <bd/nn/llama.hpp>
#include <bd/nn/metrics.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

// A few sentences in the model's register (written for bd), for the perplexity line.
const char* const kText =
    "Once upon a time, there was a little boy named Tom. Tom liked to play in the park with his red ball. "
    "One day, the ball rolled under a big tree. Tom was sad, but his friend Sue helped him find it. "
    "They played together until the sun went down, and they were very happy.";

struct Args {
  std::string dir = BD_EXAMPLE_MODEL, prompt = "Once upon a time", tokenizer, dtype = "f32", mode = "vo", basis = "auto";
  std::string windows = "per-group";
  bd::kernel::Compute compute = bd::kernel::Compute::F32;
  int tokens = 100;
  bool force = false;
};

struct Run {
  std::vector<int> ids;  ///< the generated ids (the prompt's not included)
  double seconds = 0, perplexity = 0;
};

/// Greedy generation with the KV cache: the prompt in one call, then one token per call; stops
/// at BOS or EOS (llama2.c's models end a story with BOS) or after `count` tokens.
template <typename Model>
Run generate(const Model& model, const std::vector<int>& prompt, int count, const std::vector<int>& text) {
  Run r;
  typename Model::Cache cache;
  const auto start = std::chrono::steady_clock::now();
  auto logits = model.decode(prompt, cache);
  for (int i = 0; i < count; ++i) {
    Eigen::Index next = 0;
    logits.row(logits.rows() - 1).maxCoeff(&next);
    if (next == bd::io::Tokenizer::bos || next == bd::io::Tokenizer::eos) break;
    r.ids.push_back(int(next));
    logits = model.decode({int(next)}, cache);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.perplexity = bd::nn::perplexity(model.logits(text), text);
  return r;
}

/// The same greedy ids by running the whole prefix again for every token (no cache).
template <typename Model>
std::vector<int> generate_without_cache(const Model& model, std::vector<int> ids, std::size_t count) {
  const std::size_t first = ids.size();
  while (ids.size() - first < count) {
    Eigen::Index next = 0;
    const auto logits = model.logits(ids);
    logits.row(logits.rows() - 1).maxCoeff(&next);
    ids.push_back(int(next));
  }
  return std::vector<int>(ids.begin() + std::ptrdiff_t(first), ids.end());
}

std::string text_of(const bd::io::Tokenizer& t, const std::vector<int>& prompt, const std::vector<int>& ids) {
  std::vector<int> all = prompt;
  all.insert(all.end(), ids.begin(), ids.end());
  return t.decode(all);
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [MODEL_DIR] [--prompt TEXT] [--tokens N] [--dtype f32|f16|bf16] [--compute f32|bf16] "
               "[--mode vo|qk|qkvo] [--basis B] [--windows per-group|per-head] [--force] [--tokenizer PATH]\n",
               argv0);
  return 2;
}

template <typename S>
int run(const Args& a) {
  auto dense = bd::io::load_llama<float>(a.dir);
  const std::string tok_path = !a.tokenizer.empty()                                     ? a.tokenizer
                               : std::filesystem::exists(a.dir + "/tok512.bin")          ? a.dir + "/tok512.bin"
                                                                                         : a.dir + "/tokenizer.bin";
  const auto tokenizer = bd::io::Tokenizer::read(tok_path, int(dense.config.vocab));
  bd::nn::BDAttentionOptions opts;
  opts.mode = bd::nn::parse_mode(a.mode);
  opts.decomposition.basis = bd::parse_basis(a.basis);
  opts.windows = bd::nn::parse_windows(a.windows);
  if (a.force) opts = opts.with_force(true).with_cost_policy(bd::nn::CostPolicy::Allow);
  auto bd_model = dense.with_bd_attention<S>(opts);
  dense.set_compute(a.compute);
  bd_model.set_compute(a.compute);

  const std::vector<int> prompt = tokenizer.encode(a.prompt);
  std::ifstream config(a.dir + "/config.json");
  const long context = nlohmann::json::parse(config).value("max_position_embeddings", 0L);
  if (context > 0 && long(prompt.size()) + a.tokens > context)
    throw bd::RangeError("the prompt's " + std::to_string(prompt.size()) + " tokens and " + std::to_string(a.tokens) +
                         " more exceed the model's context of " + std::to_string(context) + " (max_position_embeddings)");
  const std::vector<int> text = tokenizer.encode(kText);
  const Run d = generate(dense, prompt, a.tokens, text);
  const Run b = generate(bd_model, prompt, a.tokens, text);
  const bool cache_exact = generate_without_cache(dense, prompt, d.ids.size()) == d.ids;
  std::size_t agree = 0;
  while (agree < d.ids.size() && agree < b.ids.size() && d.ids[agree] == b.ids[agree]) ++agree;
  const bool same = d.ids == b.ids;

  const char* compute = bd::kernel::to_string(a.compute);
  std::printf("%s: %lld layers, d = %lld, %lld query heads on %lld key/value heads; BD %s, %s basis, stored in %s, "
              "%s compute\n\n",
              a.dir.c_str(), (long long)dense.config.layers, (long long)dense.config.hidden, (long long)dense.config.heads,
              (long long)dense.config.kv_heads, a.mode.c_str(), a.basis.c_str(), a.dtype.c_str(), compute);
  std::printf("dense (fp32, %s compute):\n%s\n\nBD (%s, %s compute):\n%s\n\n", compute, text_of(tokenizer, prompt, d.ids).c_str(),
              a.dtype.c_str(), compute, text_of(tokenizer, prompt, b.ids).c_str());
  std::printf("token ids: %s (%zu of %zu generated agree before the first difference)\n", same ? "identical" : "differ",
              agree, d.ids.size());
  std::printf("%-12s %10s %12s\n%-12s %10.0f %12.6f\n%-12s %10.0f %12.6f\n", "model", "tokens/s", "perplexity", "dense",
              double(d.ids.size()) / d.seconds, d.perplexity, "BD", double(b.ids.size()) / b.seconds, b.perplexity);
  std::printf("{\"tokens\": %zu, \"ids_identical\": %s, \"agree\": %zu, \"cache_equals_recompute\": %s, "
              "\"dense_tokens_per_s\": %.1f, \"bd_tokens_per_s\": %.1f, \"dense_ppl\": %.6f, \"bd_ppl\": %.6f}\n",
              d.ids.size(), same ? "true" : "false", agree, cache_exact ? "true" : "false",
              double(d.ids.size()) / d.seconds, double(b.ids.size()) / b.seconds, d.perplexity, b.perplexity);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--prompt") && has_value) a.prompt = argv[++i];
    else if (!std::strcmp(argv[i], "--tokens") && has_value) a.tokens = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--dtype") && has_value) a.dtype = argv[++i];
    else if (!std::strcmp(argv[i], "--compute") && has_value) {
      try {
        a.compute = bd::kernel::parse_compute(argv[++i]);
      } catch (const bd::Error& e) {
        std::fprintf(stderr, "generate: %s\n", e.what());
        return 2;
      }
    }
    else if (!std::strcmp(argv[i], "--mode") && has_value) a.mode = argv[++i];
    else if (!std::strcmp(argv[i], "--basis") && has_value) a.basis = argv[++i];
    else if (!std::strcmp(argv[i], "--tokenizer") && has_value) a.tokenizer = argv[++i];
    else if (!std::strcmp(argv[i], "--windows") && has_value) a.windows = argv[++i];
    else if (!std::strcmp(argv[i], "--force")) a.force = true;
    else if (argv[i][0] != '-') a.dir = argv[i];
    else return usage(argv[0]);
  }
  if (a.tokens < 1) return usage(argv[0]);
  try {
    if (a.prompt.empty()) throw bd::RangeError("the prompt is empty: give --prompt TEXT");
    const bd::Storage s = bd::parse_storage(a.dtype);
    if (s == bd::Storage::F64) throw bd::RangeError("--dtype f64: the BD model runs in f32, f16 or bf16 here");
    return bd::dispatch(s, [&](auto t) {
      using S = typename decltype(t)::type;
      if constexpr (std::is_same_v<S, double>) return 1;
      else return run<S>(a);
    });
  } catch (const bd::RefusedError& e) {
    std::fprintf(stderr, "generate: %s\n(--force generates with it anyway)\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "generate: %s\n", e.what());
    return 1;
  }
}
