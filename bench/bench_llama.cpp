// A low-rank-pruned LLaMA2-7B-shaped decoder against its BD form, end to end (the paper's Table 4,
// "BD from low-rank", on the CPU): every linear layer of every decoder layer — q, k, v, o, gate,
// up, down — is U·Vᵀ at the rank that keeps 80 % of its parameters (LowRankLinear, both products
// on bd's kernel), and the BD model replaces each by its BD form (BDLinear::from_low_rank). Same
// attention core, same RMSNorms, same threads and precision (fp32), in the same run:
//
//   llama/<lowrank|bd>/prefill/<L>        L tokens through the decoder (no cache), tokens/s
//   llama/<lowrank|bd>/decode/<context>   one token after `context` cached tokens, tokens/s
//
// Shape: hidden 4096, 32 heads of 128 (MHA), FFN 11008, RoPE; kLayers decoder layers (LLaMA2-7B
// has 32: each is the same work, and 4 keep both models in memory with room to spare). The
// vocabulary is 256, not 32000: embedding and head are dense in both models, the same work on
// either side, and at 4 layers a 32000-word head would be a fifth of the time.
// `theoretical_ratio` is the FLOP ratio low-rank / BD of the step (attention's scores and P·V
// included, which BD does not change).
#include <benchmark/benchmark.h>

#include <cmath>
#include <string>
#include <vector>

#include <bd/nn/llama.hpp>

namespace {

using bd::nn::BDLinear;
using bd::nn::LowRankLinear;
using bd::nn::ProjectedAttention;
using Eigen::Index;

constexpr Index kHidden = 4096, kHeads = 32, kHeadDim = 128, kFfn = 11008, kVocab = 256, kLayers = 4;

using LowRankModel = bd::nn::LlamaModel<float, ProjectedAttention<LowRankLinear<float>>, LowRankLinear<float>>;
using BDModel = bd::nn::LlamaModel<float, ProjectedAttention<BDLinear<float>>, BDLinear<float>>;

Index rank_of(Index d_in, Index d_out) { return Index(0.8 * double(d_in) * double(d_out) / double(d_in + d_out)); }

struct Models {
  LowRankModel low_rank;
  BDModel bd;
};

const Models& models() {
  static const Models m = [] {
    // One low-rank layer per shape, prepared once; every decoder layer holds its own copies (the
    // weights' values do not change the work, their bytes must still each be read).
    auto make = [](Index in, Index out, unsigned seed) {
      std::srand(seed);
      const Index r = rank_of(in, out);
      return LowRankLinear<float>(Eigen::MatrixXf::Random(in, r) / std::sqrt(float(in)),
                                  Eigen::MatrixXf::Random(out, r) / std::sqrt(float(r)));
    };
    const LowRankLinear<float> square = make(kHidden, kHidden, 1), up = make(kHidden, kFfn, 2), down = make(kFfn, kHidden, 3);
    const bd::Options first = bd::Options{}.with_basis(bd::Basis::First);
    const BDLinear<float> bd_square = BDLinear<float>::from_low_rank(square, first), bd_up = BDLinear<float>::from_low_rank(up, first),
                          bd_down = BDLinear<float>::from_low_rank(down, first);
    bd::nn::AttentionConfig c;
    c.n_q = c.n_kv = kHeads;
    c.head_dim = kHeadDim;
    c.causal = true;
    c.rope_theta = 10000;
    auto fill = [&](auto& model, const auto& sq, const auto& u, const auto& d) {
      using Model = std::decay_t<decltype(model)>;
      model.config.hidden = kHidden, model.config.intermediate = kFfn, model.config.layers = kLayers;
      model.config.heads = model.config.kv_heads = kHeads, model.config.head_dim = kHeadDim, model.config.vocab = kVocab;
      std::srand(4);
      model.embedding = Eigen::MatrixXf::Random(kVocab, kHidden);
      model.lm_head = Eigen::MatrixXf::Random(kHidden, kVocab) / std::sqrt(float(kHidden));
      model.final_norm = Eigen::VectorXf::Ones(kHidden);
      for (Index l = 0; l < kLayers; ++l)
        model.layers.push_back(typename Model::Layer{Eigen::VectorXf::Ones(kHidden), Eigen::VectorXf::Ones(kHidden),
                                                     {c, sq, sq, sq, sq}, u, u, d});
    };
    Models out;
    fill(out.low_rank, square, up, down);
    fill(out.bd, bd_square, bd_up, bd_down);
    return out;
  }();
  return m;
}

/// FLOPs per token of the decoder layers for a token that sees `keys` keys.
double token_flops(bool bd, double keys) {
  auto linear = [&](Index in, Index out) {
    const double r = double(rank_of(in, out));
    return 2 * r * (double(in + out) - (bd ? r : 0));
  };
  const double per_layer = 4 * linear(kHidden, kHidden) + 2 * linear(kHidden, kFfn) + linear(kFfn, kHidden) +
                           2 * keys * double(kHeads) * 2 * double(kHeadDim);
  return double(kLayers) * per_layer + 2 * double(kHidden) * double(kVocab);
}

std::vector<int> tokens(Index n) {
  std::vector<int> t(static_cast<std::size_t>(n));
  for (Index i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = int((31 * i + 7) % kVocab);
  return t;
}

template <typename Model>
void prefill(benchmark::State& state, const Model& model, bool bd) {
  const Index L = state.range(0);
  const std::vector<int> t = tokens(L);
  for (auto _ : state) {
    Eigen::MatrixXf logits = model.logits(t);
    benchmark::DoNotOptimize(logits.data());
  }
  const double keys = (double(L) + 1) / 2;  // causal: the work the layer must do
  state.counters["tokens/s"] = benchmark::Counter(double(L), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["FLOP/s"] =
      benchmark::Counter(double(L) * token_flops(bd, keys), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["theoretical_ratio"] = token_flops(false, keys) / token_flops(true, keys);
}

template <typename Model>
void decode(benchmark::State& state, const Model& model, bool bd) {
  const Index context = state.range(0);
  typename Model::Cache cache;
  model.decode(tokens(context + 1), cache);  // one token more, dropped: the cache has room for the next
  cache.truncate(context);
  const std::vector<int> next{1};
  for (auto _ : state) {
    Eigen::MatrixXf logits = model.decode(next, cache);
    benchmark::DoNotOptimize(logits.data());
    cache.truncate(context);
  }
  state.counters["tokens/s"] = benchmark::Counter(1, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["FLOP/s"] =
      benchmark::Counter(token_flops(bd, double(context + 1)), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["theoretical_ratio"] = token_flops(false, double(context + 1)) / token_flops(true, double(context + 1));
}

int register_all() {
  for (const bool bd : {false, true}) {
    const std::string name = bd ? "bd" : "lowrank";
    benchmark::RegisterBenchmark(("llama/" + name + "/prefill").c_str(),
                                 [bd](benchmark::State& s) {
                                   if (bd) prefill(s, models().bd, true);
                                   else prefill(s, models().low_rank, false);
                                 })
        ->Arg(128)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
    benchmark::RegisterBenchmark(("llama/" + name + "/decode").c_str(),
                                 [bd](benchmark::State& s) {
                                   if (bd) decode(s, models().bd, true);
                                   else decode(s, models().low_rank, false);
                                 })
        ->Arg(128)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
  }
  return 0;
}

const int registered = register_all();

}  // namespace
