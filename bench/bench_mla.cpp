// MLA as DeepSeek-V3 is served, dense against BD, fp32, same threads, same run:
//
//   decode/mla_absorbed/<dense|bd>/<context>   one token decoded absorbed over a latent cache of
//                                              `context` tokens (c and k_rope: 576 values each);
//   prefill/mla_chunk/<dense|bd>/<context>     a chunk of 64 new tokens against `context` cached
//                                              ones, by the path the cost model picks (counter
//                                              `absorbed`: 1 when it maps queries into the latent);
//   prefill/mla_recompute/<dense|bd>/<context> the same chunk with K/V (K'/V' by Algorithm 2 for
//                                              BD) recomputed from the cached latent;
//   decode/mla_absorbed/interleaved/<context>  the two layers' token in turn within one benchmark
//                                              (interleaved.hpp): medians, speedup, GFLOP/s, and
//                                              the token's floor on this machine in the same
//                                              seconds (weights at the read rate, attention at
//                                              the GEMM rate): bd_share_of_floor;
//   prefill/mla_chunk/interleaved/<context>    the same for the chunk (automatic path).
//   decode/mla_absorbed/interleaved_bf16/<context>  the token with both layers stored and
//                                              computing in bf16 (the latent cache in f32), beside
//                                              the BD layer's f32 token (bf16_over_f32, paired).
//
// The layer is DeepSeek-V3's at full size (config.json of deepseek-ai/DeepSeek-V3): hidden 7168,
// 128 heads, query LoRA 1536, latent 512, nope 128, rope 64, v 128; weights uniform with the
// variance of 1/fan_in (speed does not depend on their values; BD with the first-rows basis).
// Counters: `theoretical_ratio` is dense FLOPs / BD FLOPs of the step as bd::nn::mla_cost and
// bd::nn::chunk_plan count them (projections) plus the attention over the context, which BD does
// not change. Every product of both layers runs on the dispatched kernel, attention on its
// flash core.
#include <benchmark/benchmark.h>

#include <bd/kernel/matmul.hpp>
#include <bd/nn/bd_attention.hpp>
#include <bd/nn/cost_model.hpp>
#include <bd/nn/multi_head_attention.hpp>

#include "bf16_layers.hpp"
#include "interleaved.hpp"
#include "read_rate.hpp"

namespace {

using bd::nn::BDAttention;
using bd::nn::MultiHeadAttention;
using Eigen::Index;

constexpr Index kHidden = 7168, kHeads = 128, kQLora = 1536, kLatent = 512, kNope = 128, kRope = 64, kV = 128;
constexpr Index kChunk = 64;

struct MlaPair {
  MultiHeadAttention<float> dense;
  BDAttention<float> bd;
  bd::nn::AttentionShape shape;
};

const MlaPair& mla_pair() {
  static const MlaPair pair = [] {
    bd::nn::AttentionConfig c;
    c.n_q = c.n_kv = kHeads;
    c.head_dim = kNope;
    c.v_head_dim = kV;
    c.rope_dim = kRope;
    c.causal = true;
    bd::nn::AttentionWeights<float> w;
    const auto uniform = [](Index rows, Index cols) -> Eigen::MatrixXf {
      return Eigen::MatrixXf::Random(rows, cols) * (1.732f / std::sqrt(float(rows)));
    };
    w.W_qa = uniform(kHidden, kQLora);
    w.q_norm = Eigen::VectorXf::Ones(kQLora);
    w.Wq = uniform(kQLora, kHeads * kNope);
    w.Wq_rope = uniform(kQLora, kHeads * kRope);
    w.W_dkv = uniform(kHidden, kLatent);
    w.kv_norm = Eigen::VectorXf::Ones(kLatent);
    w.Wk_rope = uniform(kHidden, kRope);
    w.Wk = uniform(kLatent, kHeads * kNope);
    w.Wv = uniform(kLatent, kHeads * kV);
    w.Wo = uniform(kHeads * kV, kHidden);
    MultiHeadAttention<float> dense(c, std::move(w));
    auto bd = BDAttention<float>::prepare(dense, bd::nn::BDAttentionOptions{}.with_basis(bd::Basis::First));
    const auto shape = bd::nn::AttentionShape::of(dense.config(), dense.weights());
    return MlaPair{std::move(dense), std::move(bd), shape};
  }();
  return pair;
}

/// A latent cache holding `context` tokens, with room for `extra` more (no timed growth), stored
/// in `storage`.
bd::nn::LatentCache<float> filled_cache(Index context, Index extra, bd::Storage storage = bd::Storage::F32) {
  bd::nn::LatentCache<float> cache(storage);
  cache.append(Eigen::MatrixXf::Random(context + extra, kLatent), Eigen::MatrixXf::Random(context + extra, kRope));
  cache.truncate(context);
  return cache;
}

/// One token decoded absorbed by the dense or the BD layer; the cache back to `context` tokens.
void decode_token(const MlaPair& pair, bool bd, const Eigen::MatrixXf& x, bd::nn::LatentCache<float>& cache, Index context) {
  Eigen::MatrixXf y = bd ? pair.bd.decode_absorbed(x, cache) : pair.dense.decode_absorbed(x, cache);
  benchmark::DoNotOptimize(y.data());
  cache.truncate(context);
}

/// FLOPs of one absorbed token over `context` cached ones: the projections (mla_cost) plus the
/// attention over the context, which BD does not change.
struct DecodeFlops {
  double dense, bd;
  double bd_weights;  ///< the BD layer's parameters: what its token reads once
  DecodeFlops(const MlaPair& pair, Index context) {
    const auto m = bd::nn::mla_cost(pair.shape, bd::nn::Mode::QKVO);
    const double attend = m.context_flops(double(context + 1), pair.shape);
    dense = m.decode_dense + attend, bd = m.decode_bd + attend, bd_weights = m.parameters_bd;
  }
};

void decode_absorbed(benchmark::State& state, bool bd) {
  const MlaPair& pair = mla_pair();
  const Index context = state.range(0);
  auto cache = filled_cache(context, 1);
  const Eigen::MatrixXf x = Eigen::MatrixXf::Random(1, kHidden);
  for (auto _ : state) decode_token(pair, bd, x, cache, context);
  const DecodeFlops f(pair, context);
  state.counters["FLOP/s"] = benchmark::Counter(bd ? f.bd : f.dense, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["theoretical_ratio"] = f.dense / f.bd;
}

/// The counters of an interleaved dense/BD benchmark: each one's median time (t[0] dense, t[1]
/// BD) and rate from its FLOPs, the speedup (the ratio of the medians) and its share of the FLOP
/// ratio, and `paired_speedup`: the median of each iteration's dense/BD ratio (paired_ratio).
void pair_counters(benchmark::State& state, const std::vector<double>& t, const std::vector<std::vector<double>>& seconds,
                   double dense_flops, double bd_flops) {
  state.counters["dense_ms"] = t[0] * 1e3;
  state.counters["bd_ms"] = t[1] * 1e3;
  state.counters["dense_GFLOP/s"] = dense_flops / t[0] * 1e-9;
  state.counters["bd_GFLOP/s"] = bd_flops / t[1] * 1e-9;
  state.counters["speedup"] = t[0] / t[1];
  state.counters["paired_speedup"] = bd_bench::paired_ratio(seconds[0], seconds[1]);
  state.counters["theoretical_ratio"] = dense_flops / bd_flops;
  state.counters["share_of_theory"] = t[0] / t[1] / (dense_flops / bd_flops);
}

/// decode/mla_absorbed/interleaved/<context>: the dense and BD layers' token in turn within one
/// benchmark (interleaved.hpp), each on its own cache: medians and ratio from the same seconds.
/// Beside them, in the same rotation, the two things a token cannot do faster than this machine
/// allows: reading the BD layer's weights once (a plain sequential read of as many bytes,
/// read_rate.hpp: every weight is used once a token, so they stream from memory at best at this
/// rate) and the attention's arithmetic as the GEMMs it is (S = Q̃·Kᵀ and O = S·V for the 128
/// query heads against one latent of `context` rows, on bd's kernel, no softmax). The token's
/// floor is the weights' bytes at that read rate plus the attention's FLOPs at that GEMM rate;
/// `bd_share_of_floor` is floor / BD's time (1: nothing but those two), and `floor_GFLOP/s` the
/// token's FLOPs over the floor: the most GFLOP/s a token can reach on this machine, so that a
/// share of the GEMM rate (bd_GFLOP/s over gemm/bd_kernel's) reads against the floor's.
void decode_absorbed_interleaved(benchmark::State& state) {
  const MlaPair& pair = mla_pair();
  const Index context = state.range(0);
  auto dense_cache = filled_cache(context, 1), bd_cache = filled_cache(context, 1);
  const Eigen::MatrixXf x = Eigen::MatrixXf::Random(1, kHidden);
  const DecodeFlops f(pair, context);
  const Eigen::VectorXf weights = Eigen::VectorXf::Random(Index(f.bd_weights));
  using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const RowMajor latent = RowMajor::Random(context + 1, kLatent + kRope);  // the cache's rows: [c | k_rope]
  const Eigen::MatrixXf queries = Eigen::MatrixXf::Random(kHeads, kLatent + kRope);
  Eigen::MatrixXf scores(kHeads, context + 1), outputs(kHeads, kLatent);
  std::vector<std::vector<double>> seconds;
  const std::vector<double> t = bd_bench::time_interleaved(
      state, {[&] { decode_token(pair, false, x, dense_cache, context); },
              [&] { decode_token(pair, true, x, bd_cache, context); },
              [&] {
                float total = bd_bench::read_all(weights.data(), weights.size());
                benchmark::DoNotOptimize(total);
              },
              [&] {
                bd::kernel::matmul_into(queries, latent.transpose(), scores);
                bd::kernel::matmul_into(scores, latent.leftCols(kLatent), outputs);
                benchmark::DoNotOptimize(outputs.data());
              }},
      {}, &seconds);
  pair_counters(state, t, seconds, f.dense, f.bd);
  const double floor = t[2] + t[3];  // the read, then the attention's GEMMs
  const double gemm_flops = 2.0 * double(kHeads) * double(context + 1) * double(2 * kLatent + kRope);
  state.counters["read_GB/s"] = f.bd_weights * sizeof(float) / t[2] * 1e-9;
  state.counters["attention_gemm_GFLOP/s"] = gemm_flops / t[3] * 1e-9;
  state.counters["floor_ms"] = floor * 1e3;
  state.counters["floor_GFLOP/s"] = f.bd / floor * 1e-9;
  state.counters["bd_share_of_floor"] = floor / t[1];
}

/// The pair stored in bf16 and computing in bf16 (bf16_layers.hpp).
const bd_bench::Bf16LayerPair& bf16_mla_pair() {
  static const bd_bench::Bf16LayerPair pair = bd_bench::bf16_layer_pair(mla_pair().dense);
  return pair;
}

/// decode/mla_absorbed/interleaved_bf16/<context>: the two layers' token in bf16 (stored and
/// computing), each on its own bf16 latent cache, in turn with the BD layer's token in f32 on an
/// f32 cache and in bf16 on an f32 cache: medians, ratio, `bf16_over_f32` (the BD token in bf16
/// over the same in f32, paired) and `bf16_cache_gain` (the BD bf16 token on an f32 cache over
/// the same on the bf16 cache, paired: what storing the cache in bf16 buys).
void decode_absorbed_interleaved_bf16(benchmark::State& state) {
  const bd_bench::Bf16LayerPair& pair = bf16_mla_pair();
  const Index context = state.range(0);
  auto dense_cache = filled_cache(context, 1, bd::Storage::BF16), bd_cache = filled_cache(context, 1, bd::Storage::BF16),
       f32_cache = filled_cache(context, 1), bd_f32_cache = filled_cache(context, 1);
  const Eigen::MatrixXf x = Eigen::MatrixXf::Random(1, kHidden);
  const auto token = [&](bool bd, bd::nn::LatentCache<float>& cache) {
    return [&, bd] {
      Eigen::MatrixXf y = bd ? pair.bd.decode_absorbed(x, cache) : pair.dense.decode_absorbed(x, cache);
      benchmark::DoNotOptimize(y.data());
      cache.truncate(context);
    };
  };
  std::vector<std::vector<double>> seconds;
  const std::vector<double> t = bd_bench::time_interleaved(
      state,
      {token(false, dense_cache), token(true, bd_cache), [&] { decode_token(mla_pair(), true, x, f32_cache, context); },
       token(true, bd_f32_cache)},
      {}, &seconds);
  const DecodeFlops f(mla_pair(), context);
  pair_counters(state, t, seconds, f.dense, f.bd);
  state.counters["bd_f32_ms"] = t[2] * 1e3;
  state.counters["bf16_over_f32"] = bd_bench::paired_ratio(seconds[1], seconds[2]);
  state.counters["bd_bf16_f32_cache_ms"] = t[3] * 1e3;
  state.counters["bf16_cache_gain"] = bd_bench::paired_ratio(seconds[3], seconds[1]);
}

/// A chunk of kChunk tokens prefilled by the dense or the BD layer over `context` cached ones,
/// by `path`; the cache back to `context` tokens.
void prefill_tokens(const MlaPair& pair, bool bd, const Eigen::MatrixXf& x, bd::nn::LatentCache<float>& cache, Index context,
                    bd::nn::PrefillPath path) {
  Eigen::MatrixXf y = bd ? pair.bd.prefill(x, cache, path) : pair.dense.prefill(x, cache, path);
  benchmark::DoNotOptimize(y.data());
  cache.truncate(context);
}

/// FLOPs of a chunk's step by `path` (automatic: the cost model's choice): the chunk's own
/// projections, then the path's work (bd::nn::chunk_plan: the K/V up-projection of all context +
/// chunk tokens and attention at the heads' widths, or the maps into and out of the latent and
/// attention at its width). Causal: the chunk's own keys count in full (a 64-token triangle
/// against 16k keys is below the figures' precision).
struct ChunkFlops {
  double dense, bd;
  bool dense_absorbed, bd_absorbed;
  ChunkFlops(const MlaPair& pair, Index context, bd::nn::PrefillPath path) {
    const auto per = bd::nn::attention_cost(pair.shape, bd::nn::Mode::QKVO);
    const double own = double(kChunk) * (per.dense.q_flops + per.dense.o_flops + per.dense.other_flops);
    const auto plan_d = pair.dense.plan_chunk(kChunk, context + kChunk), plan_b = pair.bd.plan_chunk(kChunk, context + kChunk);
    const bd::nn::PrefillPath chosen_d = path == bd::nn::PrefillPath::Automatic ? plan_d.path : path;
    const bd::nn::PrefillPath chosen_b = path == bd::nn::PrefillPath::Automatic ? plan_b.path : path;
    const auto work = [](const bd::nn::ChunkPlan& p, bd::nn::PrefillPath c) {
      return c == bd::nn::PrefillPath::Absorbed ? p.absorbed_flops : p.recompute_flops;
    };
    dense = own + work(plan_d, chosen_d), bd = own + work(plan_b, chosen_b);
    dense_absorbed = chosen_d == bd::nn::PrefillPath::Absorbed, bd_absorbed = chosen_b == bd::nn::PrefillPath::Absorbed;
  }
};

/// A chunk of kChunk tokens over `context` cached ones, by `path` (automatic: the cost model's
/// choice, reported as the counter `absorbed`).
void prefill_chunk(benchmark::State& state, bool bd, bd::nn::PrefillPath path) {
  const MlaPair& pair = mla_pair();
  const Index context = state.range(0);
  auto cache = filled_cache(context, kChunk);
  const Eigen::MatrixXf x = Eigen::MatrixXf::Random(kChunk, kHidden);
  for (auto _ : state) prefill_tokens(pair, bd, x, cache, context, path);
  const ChunkFlops f(pair, context, path);
  state.counters["FLOP/s"] = benchmark::Counter(bd ? f.bd : f.dense, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["theoretical_ratio"] = f.dense / f.bd;
  state.counters["absorbed"] = double(bd ? f.bd_absorbed : f.dense_absorbed);
}

/// prefill/mla_chunk/interleaved/<context>: the dense and BD layers' chunk (automatic path) in
/// turn within one benchmark, each on its own cache: medians and ratio from the same seconds.
void prefill_chunk_interleaved(benchmark::State& state) {
  const MlaPair& pair = mla_pair();
  const Index context = state.range(0);
  const auto path = bd::nn::PrefillPath::Automatic;
  auto dense_cache = filled_cache(context, kChunk), bd_cache = filled_cache(context, kChunk);
  const Eigen::MatrixXf x = Eigen::MatrixXf::Random(kChunk, kHidden);
  std::vector<std::vector<double>> seconds;
  const std::vector<double> t = bd_bench::time_interleaved(state, {[&] { prefill_tokens(pair, false, x, dense_cache, context, path); },
                                                                   [&] { prefill_tokens(pair, true, x, bd_cache, context, path); }},
                                                           {}, &seconds);
  const ChunkFlops f(pair, context, path);
  pair_counters(state, t, seconds, f.dense, f.bd);
  state.counters["absorbed"] = double(f.bd_absorbed);
}

int register_all() {
  for (const bool bd : {false, true}) {
    const std::string name = bd ? "bd" : "dense";
    benchmark::RegisterBenchmark(("decode/mla_absorbed/" + name).c_str(), [bd](benchmark::State& s) { decode_absorbed(s, bd); })
        ->Arg(1024)->Arg(4096)->Arg(16384)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
    benchmark::RegisterBenchmark(("prefill/mla_chunk/" + name).c_str(),
                                 [bd](benchmark::State& s) { prefill_chunk(s, bd, bd::nn::PrefillPath::Automatic); })
        ->Arg(1024)->Arg(4096)->Arg(16384)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
    benchmark::RegisterBenchmark(("prefill/mla_recompute/" + name).c_str(),
                                 [bd](benchmark::State& s) { prefill_chunk(s, bd, bd::nn::PrefillPath::Recompute); })
        ->Arg(1024)->Arg(4096)->Arg(16384)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
  }
  benchmark::RegisterBenchmark("decode/mla_absorbed/interleaved_bf16", decode_absorbed_interleaved_bf16)
      ->Arg(16384)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
  benchmark::RegisterBenchmark("decode/mla_absorbed/interleaved", decode_absorbed_interleaved)
      ->Arg(1024)->Arg(16384)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
  benchmark::RegisterBenchmark("prefill/mla_chunk/interleaved", prefill_chunk_interleaved)
      ->Arg(1024)->Arg(16384)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
  return 0;
}

const int registered = register_all();

}  // namespace
