// prepare/<strategy>/deepseek-v2-lite: Basis Decomposition of QK and VO for every head of all
// 27 layers of DeepSeek-V2-Lite (synthetic weights, exact shapes), stored in f16 (and, for
// prepare-f32/…, in f32: B formed in double). prepare/<strategy>/deepseek-v3/layer: one layer of
// DeepSeek-V3 (128 heads; the query side is the 1536-wide q LoRA latent), f16; `model_s` is the
// 61 identical layers' total.
// QK uses the column form (C on the key side: K' = c[:, window] + c[:, rest]·C), VO the row
// form (V' = c[:, window] + c[:, rest]·C), as in the paper; both windows live on the latent.
// Counters: elapsed seconds per phase (bd::PhaseTimes), summed over layers.
#include <benchmark/benchmark.h>

#include <bd/bd.hpp>

#include "deepseek_layers.hpp"

namespace {

using bd_bench::v2_lite_layers;
using bd_bench::v3_layer;

template <typename Scalar>
void prepare(benchmark::State& state, const std::vector<synthetic::AttentionLayerFactors>& layers, bd::Basis basis,
             int model_layers) {
  const bd::Options qk = bd::Options{}.with_side(bd::Side::Col).with_basis(basis);
  const bd::Options vo = bd::Options{}.with_side(bd::Side::Row).with_basis(basis);
  double nmse = 0;
  bd::PhaseTimes phases;
  for (auto _ : state) {
    nmse = 0;
    phases = {};
    bd::Workspace ws;  // scratch reused by every layer, as bd-convert does
    for (const auto& layer : layers) {
      const auto q = bd::decompose_shared<Scalar>(layer.q, layer.uk, qk, ws);
      const auto v = bd::decompose_shared<Scalar>(layer.uv, layer.o, vo, ws);
      nmse += (q.mean_nmse() + v.mean_nmse()) / (2.0 * layers.size());
      phases += q.phases();
      phases += v.phases();
      benchmark::DoNotOptimize(q);
    }
  }
  state.counters["products"] = 2.0 * layers.size() * layers.front().q.size();
  state.counters[std::string("mean_nmse_") + bd::scalar_traits<Scalar>::name] = nmse;
  state.counters["factor_s"] = phases.factor;
  state.counters["score_s"] = phases.score;
  state.counters["fit_s"] = phases.fit;
  state.counters["round_s"] = phases.round;
  state.counters["error_s"] = phases.error;
  if (model_layers > 1) state.counters["model_s"] = phases.total() * model_layers / double(layers.size());
}

void register_all() {
  const std::pair<const char*, bd::Basis> strategies[] = {{"first", bd::Basis::First},
                                                          {"residual-min", bd::Basis::ResidualMin},
                                                          {"offset-search", bd::Basis::OffsetSearch},
                                                          {"pivoted", bd::Basis::Pivoted},
                                                          {"auto", bd::Basis::Auto}};
  for (const auto& [name, basis] : strategies) {
    const bd::Basis b = basis;
    benchmark::RegisterBenchmark((std::string("prepare/") + name + "/deepseek-v2-lite").c_str(),
                                 [b](benchmark::State& s) { prepare<Eigen::half>(s, v2_lite_layers(), b, 1); })
        ->Unit(benchmark::kSecond)
        ->Iterations(1);
  }
  for (const auto& [name, basis] : strategies) {
    const bd::Basis b = basis;
    benchmark::RegisterBenchmark((std::string("prepare-f32/") + name + "/deepseek-v2-lite").c_str(),
                                 [b](benchmark::State& s) { prepare<float>(s, v2_lite_layers(), b, 1); })
        ->Unit(benchmark::kSecond)
        ->Iterations(1);
  }
  for (const auto& [name, basis] : strategies) {
    const bd::Basis b = basis;
    benchmark::RegisterBenchmark((std::string("prepare/") + name + "/deepseek-v3/layer").c_str(),
                                 [b](benchmark::State& s) {
                                   prepare<Eigen::half>(s, v3_layer(), b, synthetic::DeepSeekV3::layers);
                                 })
        ->Unit(benchmark::kSecond)
        ->Iterations(1);
  }
}

const int registered = (register_all(), 0);

}  // namespace
