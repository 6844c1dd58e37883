// prepare/<strategy>/deepseek-v2-lite: Basis Decomposition of QK and VO for every head of all
// 27 layers of DeepSeek-V2-Lite (synthetic weights, exact shapes), stored in f16.
// QK uses the column form (C on the key side: K' = c[:, window] + c[:, rest]·C), VO the row
// form (V' = c[:, window] + c[:, rest]·C), as in the paper; both windows live on the latent.
#include <benchmark/benchmark.h>

#include <bd/bd.hpp>

#include "deepseek_shapes.hpp"

namespace {

const std::vector<bd_bench::AttentionLayerFactors>& model() {
  static const auto layers = [] {
    std::vector<bd_bench::AttentionLayerFactors> out;
    for (int l = 0; l < bd_bench::DeepSeekV2Lite::layers; ++l) out.push_back(bd_bench::synthetic_layer(l));
    return out;
  }();
  return layers;
}

void prepare(benchmark::State& state, bd::Basis basis) {
  const auto& layers = model();
  const bd::Options qk = bd::Options{}.with_side(bd::Side::Col).with_basis(basis);
  const bd::Options vo = bd::Options{}.with_side(bd::Side::Row).with_basis(basis);
  double nmse = 0;
  bd::PhaseTimes phases;
  for (auto _ : state) {
    nmse = 0;
    phases = {};
    for (const auto& layer : layers) {
      const auto q = bd::decompose_shared<Eigen::half>(layer.q, layer.uk, qk);
      const auto v = bd::decompose_shared<Eigen::half>(layer.uv, layer.o, vo);
      nmse += (q.mean_nmse() + v.mean_nmse()) / (2.0 * layers.size());
      phases += q.phases();
      phases += v.phases();
      benchmark::DoNotOptimize(q);
    }
  }
  state.counters["products"] = 2.0 * layers.size() * bd_bench::DeepSeekV2Lite::heads;
  state.counters["mean_nmse_f16"] = nmse;
  // Elapsed seconds per phase (bd::PhaseTimes), summed over layers.
  state.counters["factor_s"] = phases.factor;
  state.counters["score_s"] = phases.score;
  state.counters["fit_s"] = phases.fit;
  state.counters["round_s"] = phases.round;
  state.counters["error_s"] = phases.error;
}

}  // namespace

BENCHMARK_CAPTURE(prepare, first, bd::Basis::First)->Name("prepare/first/deepseek-v2-lite")->Unit(benchmark::kSecond)->Iterations(1);
BENCHMARK_CAPTURE(prepare, residual_min, bd::Basis::ResidualMin)->Name("prepare/residual-min/deepseek-v2-lite")->Unit(benchmark::kSecond)->Iterations(1);
BENCHMARK_CAPTURE(prepare, offset_search, bd::Basis::OffsetSearch)->Name("prepare/offset-search/deepseek-v2-lite")->Unit(benchmark::kSecond)->Iterations(1);
BENCHMARK_CAPTURE(prepare, pivoted, bd::Basis::Pivoted)->Name("prepare/pivoted/deepseek-v2-lite")->Unit(benchmark::kSecond)->Iterations(1);
BENCHMARK_CAPTURE(prepare, auto, bd::Basis::Auto)->Name("prepare/auto/deepseek-v2-lite")->Unit(benchmark::kSecond)->Iterations(1);

BENCHMARK_MAIN();
