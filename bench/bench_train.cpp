// One training step of an attention layer, MHA against BDA, at the paper's training shape
// (transformer_iwslt_de_en: d = 512, 4 heads, d_h = 128, so d_h/d = 1/4), fp32, causal
// self-attention over L tokens:
//
//   train/<mha|bda>/<L>   forward(x) then backward(x, ∂y) — what a training step runs per layer
//                         (the backward recomputes Q, K, V and the softmax rows, attention_layer.hpp)
//   train/paired/<L>      the two steps alternately, each timed: the median step of each, the
//                         speedup (ratio of the medians), theoretical_ratio and share_of_theory
//
// BDA is QK and VO decomposed (first rows: speed does not depend on which rows). The FLOP count
// is what the two calls compute, counted below; `theoretical_ratio` is MHA's count over the
// layer's own, so the speedup a run measures is read against it (a ratio of medians of the two).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include <Eigen/Core>

#include <bd/base/workspace.hpp>
#include <bd/nn/bd_attention.hpp>
#include <bd/nn/multi_head_attention.hpp>

#include "interleaved.hpp"

namespace {

using Eigen::Index;

constexpr Index kDim = 512, kHeads = 4, kHeadDim = kDim / kHeads;

struct TrainPair {
  bd::nn::MultiHeadAttention<float> mha;
  bd::nn::BDAttention<float> bda;
};

const TrainPair& train_pair() {
  static const TrainPair pair = [] {
    bd::nn::AttentionConfig c;
    c.n_q = c.n_kv = kHeads;
    c.head_dim = kHeadDim;
    c.causal = true;
    bd::nn::AttentionWeights<float> w;
    const float scale = std::sqrt(3.0f / float(kDim));  // uniform with variance 1/d (Glorot for d × d)
    w.Wq = Eigen::MatrixXf::Random(kDim, kDim) * scale;
    w.Wk = Eigen::MatrixXf::Random(kDim, kDim) * scale;
    w.Wv = Eigen::MatrixXf::Random(kDim, kDim) * scale;
    w.Wo = Eigen::MatrixXf::Random(kDim, kDim) * scale;
    bd::nn::MultiHeadAttention<float> mha(c, std::move(w));
    auto bda = bd::nn::BDAttention<float>::prepare(mha, bd::nn::BDAttentionOptions{}.with_basis(bd::Basis::First));
    return TrainPair{std::move(mha), std::move(bda)};
  }();
  return pair;
}

/// FLOPs of forward(x) + backward(x, ∂y) over L tokens. A product of an L-row input with a
/// k × n weight is 2·L·k·n; BD's K' = z[:, S] + z[:, R]·C and V' are 2·L·(d − d_h)·d each, its
/// Q' = x·B_qk and y = O'·B_vo dense d × d products. Attention over the P = L(L + 1)/2 causal
/// (query, key) pairs: the forward's scores and P·V are 2·P·d each; the backward recomputes the
/// scores (2·P·d) and forms ∂V, ∂P, ∂Q, ∂K (2·P·d each); the forward is also recomputed inside the
/// backward (the log-sum-exp pass, 4·P·d). Projections: forward Q, K, V, O; backward recomputes
/// Q, K, V, then each projection's ∂W and ∂x (twice its forward).
double step_flops(double L, bool bd) {
  const double d = double(kDim), rest = double(kDim - kHeadDim);
  const double q = 2 * L * d * d, o = q;                  // dense in both layers
  const double kv = bd ? 2 * L * rest * d : 2 * L * d * d;  // each of K and V
  const double projections = (q + 2 * kv + o)               // forward
                             + (q + 2 * kv)                 // backward's recomputation
                             + 2 * (q + 2 * kv + o);        // ∂W and ∂x of each
  const double pairs = L * (L + 1) / 2;
  const double attention = 4 * pairs * d + 4 * pairs * d + 10 * pairs * d;
  return projections + attention;
}

void train_step(benchmark::State& state, bool bd) {
  const Index L = state.range(0);
  const TrainPair& pair = train_pair();
  const Eigen::MatrixXf x = Eigen::MatrixXf::Random(L, kDim), dy = Eigen::MatrixXf::Random(L, kDim) * 1e-2f;
  bd::Workspace ws;
  for (auto _ : state) {
    const Eigen::MatrixXf y = bd ? pair.bda.forward(x, ws) : pair.mha.forward(x, ws);
    const bd::nn::Gradients<float> g = bd ? pair.bda.backward(x, dy, ws) : pair.mha.backward(x, dy, ws);
    benchmark::DoNotOptimize(y.data());
    benchmark::DoNotOptimize(g.input.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(step_flops(double(L), bd), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["theoretical_ratio"] = step_flops(double(L), false) / step_flops(double(L), bd);
}

/// MHA's and BDA's steps alternately, each timed on its own (the order swapped every iteration,
/// interleaved.hpp): the two medians and their ratio come from the same seconds of the machine,
/// so a slow spell (these shared machines drift by ±10 % over seconds) slows both alike.
void train_paired(benchmark::State& state) {
  const Index L = state.range(0);
  const TrainPair& pair = train_pair();
  const Eigen::MatrixXf x = Eigen::MatrixXf::Random(L, kDim), dy = Eigen::MatrixXf::Random(L, kDim) * 1e-2f;
  bd::Workspace ws;
  const auto step = [&](bool bd) {
    return [&, bd] {
      const Eigen::MatrixXf y = bd ? pair.bda.forward(x, ws) : pair.mha.forward(x, ws);
      const bd::nn::Gradients<float> g = bd ? pair.bda.backward(x, dy, ws) : pair.mha.backward(x, dy, ws);
      benchmark::DoNotOptimize(y.data());
      benchmark::DoNotOptimize(g.input.data());
    };
  };
  const std::vector<double> t = bd_bench::time_interleaved(state, {step(false), step(true)});
  bd_bench::pair_counters(state, t[0], t[1], step_flops(double(L), false) / step_flops(double(L), true));
}

int register_all() {
  for (const bool bd : {false, true})
    benchmark::RegisterBenchmark(bd ? "train/bda" : "train/mha", [bd](benchmark::State& s) { train_step(s, bd); })
        ->Arg(128)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
  benchmark::RegisterBenchmark("train/paired", train_paired)
      ->Arg(128)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
  return 0;
}
const int registered = register_all();

}  // namespace
