// bf16 compute against the bf16 anchors, each figure from the same seconds of the machine:
//
//   bf16/interleaved/kproj/<L>   DeepSeek-V3's key projection (L × 512 → 128 heads × 128): bd's
//                                dense kernel in bf16, BD's fused projection in bf16, oneDNN's bf16
//                                matmul (plain weights, as a PyTorch tensor holds them, and
//                                prepacked: reordered once into its own layout), and bd's dense
//                                kernel in f32 — called in turn (interleaved.hpp)
//   bf16/interleaved/linear      a LLaMA-7B up projection, 1024 tokens × 4096 → 11008: the same
//                                without BD
//
// Weights are stored in bf16 for every bf16 call (bd reads them as they are), in f32 for the f32
// call. oneDNN gets its activations already in bf16, row-major (as PyTorch's bf16 linear hands
// them over; onednn_baseline.hpp), and bd its activations in f32, column-major, rounded as it
// packs them: the conversion is bd's cost, not oneDNN's. Counters: each
// call's median (ms), bd's bf16 rate (GFLOP/s, read against peak/avx512_bf16 of the same run),
// bd against oneDNN (> 1: bd faster), BD against its dense twin and the FLOP ratio, bf16 against
// f32, and paired_* from each iteration's own pair.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include <bd/kernel/gemm.hpp>
#include <bd/nn/projection.hpp>

#include "interleaved.hpp"
#ifdef BD_HAVE_ONEDNN
#include "onednn_baseline.hpp"
#endif

namespace {

using bd::Index;
using bd::kernel::Compute;

struct Shape {
  Index L, K, N, dh;  // dh > 0: a BD projection beside it (a window of dh channels at K / 2)
};

struct Operands {
  Shape s;
  Eigen::MatrixXf X, W;                                    // f32 activations and weights
  Eigen::Matrix<Eigen::bfloat16, -1, -1> Wb, Cb;           // bf16 weights, BD's coefficients
  std::vector<std::uint16_t> Xb;                           // the activations in bf16, row-major (oneDNN's input)
  Eigen::MatrixXf out;
  std::vector<Index> channels;
  explicit Operands(const Shape& shape) : s(shape) {
    X = Eigen::MatrixXf::Random(s.L, s.K);
    W = Eigen::MatrixXf::Random(s.K, s.N);
    Wb = W.cast<Eigen::bfloat16>();
    if (s.dh) Cb = Eigen::MatrixXf::Random(s.K - s.dh, s.N).cast<Eigen::bfloat16>();
    Xb.resize(std::size_t(X.size()));
    for (Index i = 0; i < s.L; ++i)
      for (Index k = 0; k < s.K; ++k) Xb[std::size_t(i * s.K + k)] = Eigen::bfloat16(X(i, k)).value;
    out = Eigen::MatrixXf::Constant(s.L, s.N, 1.0f);
    channels.resize(std::size_t(s.K));
    std::iota(channels.begin(), channels.end(), Index(0));
  }
  template <typename S>
  void dense(const Eigen::Matrix<S, -1, -1>& w, Compute compute) {
    bd::kernel::GemmArguments<float, S> a;
    a.rows = s.L, a.x = X.data(), a.ldx = s.L, a.b = w.data(), a.ldb = s.K, a.out = out.data(), a.ldo = s.L;
    a.segments.push_back({channels.data(), s.K, 0, s.N});
    a.compute = compute;
    bd::kernel::gemm(a);
    benchmark::DoNotOptimize(out.data());
  }
  void bd_projection() {
    static const bd::nn::HeadIndices window = bd::nn::HeadIndices::window(s.K, s.dh, s.K / 2, s.N / s.dh);
    bd::nn::bd_project_into<float, Eigen::bfloat16>(X, window, Cb, out, {}, bd::default_workspace(), Compute::BF16);
    benchmark::DoNotOptimize(out.data());
  }
};

double flops(const Shape& s, bool bd) { return 2.0 * double(s.L) * double(s.N) * double(bd ? s.K - s.dh : s.K); }

void interleaved(benchmark::State& state, Shape s) {
  Operands op(s);
  std::vector<std::string> names{"bd_bf16"};
  std::vector<std::function<void()>> calls{[&] { op.dense(op.Wb, Compute::BF16); }};
  if (s.dh) names.push_back("bd_projection_bf16"), calls.push_back([&] { op.bd_projection(); });
  names.push_back("bd_f32"), calls.push_back([&] { op.dense(op.W, Compute::F32); });
#ifdef BD_HAVE_ONEDNN
  bd_bench::OneDnnMatmul plain(s.L, s.N, s.K, reinterpret_cast<const std::uint16_t*>(op.Wb.data()), false);
  bd_bench::OneDnnMatmul packed(s.L, s.N, s.K, reinterpret_cast<const std::uint16_t*>(op.Wb.data()), true);
  names.push_back("onednn"), calls.push_back([&] { plain(op.Xb.data(), op.out.data()); });
  names.push_back("onednn_prepacked"), calls.push_back([&] { packed(op.Xb.data(), op.out.data()); });
  state.SetLabel(std::string("oneDNN: ") + plain.implementation() + " / " + packed.implementation());
#endif
  for (auto& call : calls) call();  // warm: packing space, oneDNN's scratch
  std::vector<std::vector<double>> seconds;
  const std::vector<double> t = bd_bench::time_interleaved(state, calls, {}, &seconds);
  const auto at = [&](const char* name) -> std::size_t {
    for (std::size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) return i;
    return names.size();
  };
  for (std::size_t i = 0; i < names.size(); ++i) state.counters[names[i] + "_ms"] = t[i] * 1e3;
  const std::size_t bf16 = at("bd_bf16"), f32 = at("bd_f32");
  state.counters["bd_bf16_GFLOP/s"] = flops(s, false) / t[bf16] * 1e-9;
  state.counters["bf16_vs_f32"] = t[f32] / t[bf16];
  state.counters["paired_bf16_vs_f32"] = bd_bench::paired_ratio(seconds[f32], seconds[bf16]);
  if (s.dh) {
    const std::size_t bd = at("bd_projection_bf16");
    const double theory = flops(s, false) / flops(s, true);
    state.counters["bd_speedup"] = t[bf16] / t[bd];
    state.counters["paired_bd_speedup"] = bd_bench::paired_ratio(seconds[bf16], seconds[bd]);
    state.counters["share_of_theory"] = t[bf16] / t[bd] / theory;
    state.counters["theoretical_ratio"] = theory;
  }
#ifdef BD_HAVE_ONEDNN
  const std::size_t onednn = at("onednn"), prepacked = at("onednn_prepacked");
  state.counters["bd_vs_onednn"] = t[onednn] / t[bf16];
  state.counters["bd_vs_onednn_prepacked"] = t[prepacked] / t[bf16];
  state.counters["paired_bd_vs_onednn"] = bd_bench::paired_ratio(seconds[onednn], seconds[bf16]);
  state.counters["paired_bd_vs_onednn_prepacked"] = bd_bench::paired_ratio(seconds[prepacked], seconds[bf16]);
  state.counters["onednn_prepacked_GFLOP/s"] = flops(s, false) / t[prepacked] * 1e-9;
#endif
}

const int registered = [] {
  for (Index L : {Index(1024), Index(4096)})
    benchmark::RegisterBenchmark(("bf16/interleaved/kproj/" + std::to_string(L)).c_str(),
                                 [L](benchmark::State& st) { interleaved(st, {L, 512, 16384, 128}); })
        ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
  benchmark::RegisterBenchmark("bf16/interleaved/linear/1024x4096x11008",
                               [](benchmark::State& st) { interleaved(st, {1024, 4096, 11008, 0}); })
      ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
  return 0;
}();

}  // namespace
