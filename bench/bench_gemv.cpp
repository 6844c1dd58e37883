// gemv/interleaved/<K>/<N>: one token through a K × N weight (y = x·W, fp32, W column-major as
// the layers store it), the product decoding is bound by. Three calls in turn within one
// benchmark (interleaved.hpp), each on the next of a few copies of W that together exceed any
// L3, so every call reads its weight from memory:
//   bd        bd::kernel::gemm, one row: the skinny path (kernel/skinny.hpp)
//   openblas  cblas_sgemv on the same bytes and threads (when OpenBLAS was found)
//   read      a plain sum of the same bytes on the same threads: the memory rate the product
//             can at best reach this second
// Counters: each one's GB/s of weight read (median call), bd's share of the read rate and its
// ratio to OpenBLAS. The shapes are decoding's: DeepSeek-V3's output projection (16384 × 7168),
// its query down-projection (7168 × 1536), LLaMA-7B's down (11008 × 4096) and up (4096 × 11008)
// projections, DeepSeek-V3's query up-projection (1536 × 24576).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <functional>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include <bd/kernel/gemm.hpp>

#ifdef BD_HAVE_OPENBLAS
#include <cblas.h>
#endif
#include "interleaved.hpp"
#include "read_rate.hpp"

namespace {

using bd::Index;

void gemv_interleaved(benchmark::State& state) {
  const Index K = state.range(0), N = state.range(1);
  const double bytes = double(K) * double(N) * sizeof(float);
  const int copies = std::max(2, int(512e6 / bytes) + 1);  // together past any L3
  std::vector<Eigen::MatrixXf> W(std::size_t(copies), Eigen::MatrixXf::Random(K, N));
  const Eigen::RowVectorXf x = Eigen::RowVectorXf::Random(K);
  Eigen::RowVectorXf y(N);
  std::vector<Index> channels(static_cast<std::size_t>(K));
  for (Index k = 0; k < K; ++k) channels[std::size_t(k)] = k;
  std::size_t next = 0;
  const auto weight = [&]() -> const Eigen::MatrixXf& { return W[next++ % W.size()]; };
  std::vector<std::function<void()>> calls{[&] {
    bd::kernel::GemmArguments<float, float> a;
    a.rows = 1, a.x = x.data(), a.ldx = 1, a.b = weight().data(), a.ldb = K, a.out = y.data(), a.ldo = 1;
    a.segments.push_back({channels.data(), K, 0, N});
    bd::kernel::gemm(a);
    benchmark::DoNotOptimize(y.data());
  }};
  calls.push_back([&] {
    float total = bd_bench::read_all(weight().data(), K * N);
    benchmark::DoNotOptimize(total);
  });
#ifdef BD_HAVE_OPENBLAS
  calls.push_back([&] {
    cblas_sgemv(CblasColMajor, CblasTrans, int(K), int(N), 1.0f, weight().data(), int(K), x.data(), 1, 0.0f, y.data(), 1);
    benchmark::DoNotOptimize(y.data());
  });
#endif
  const std::vector<double> t = bd_bench::time_interleaved(state, calls);
  state.counters["bd_GB/s"] = bytes / t[0] * 1e-9;
  state.counters["read_GB/s"] = bytes / t[1] * 1e-9;
  state.counters["bd_share_of_read"] = t[1] / t[0];
#ifdef BD_HAVE_OPENBLAS
  state.counters["openblas_GB/s"] = bytes / t[2] * 1e-9;
  state.counters["bd_vs_openblas"] = t[2] / t[0];
#endif
}

// gemv/interleaved_bf16/<K>/<N>: the same token through the weight stored in bfloat16 and read
// where it lies (decoding's bf16 layers), in bf16 compute, beside the float weight's product and
// a plain sum of the bf16 bytes. Counters: the bf16 product's GB/s (of bf16 bytes), its share of
// the read rate, and its time against the float weight's (≈ 0.5 when both stream at one rate).
void gemv_interleaved_bf16(benchmark::State& state) {
  const Index K = state.range(0), N = state.range(1);
  const double bytes = double(K) * double(N) * sizeof(Eigen::bfloat16);
  const int copies = std::max(2, int(512e6 / bytes) + 1);  // together past any L3, per type
  using Bf16Matrix = Eigen::Matrix<Eigen::bfloat16, Eigen::Dynamic, Eigen::Dynamic>;
  std::vector<Eigen::MatrixXf> W(std::size_t(std::max(2, copies / 2)), Eigen::MatrixXf::Random(K, N));
  std::vector<Bf16Matrix> Wb(std::size_t(copies), W.front().cast<Eigen::bfloat16>());
  const Eigen::RowVectorXf x = Eigen::RowVectorXf::Random(K);
  Eigen::RowVectorXf y(N);
  std::vector<Index> channels(static_cast<std::size_t>(K));
  for (Index k = 0; k < K; ++k) channels[std::size_t(k)] = k;
  std::size_t next = 0, next_bf16 = 0;
  const auto product = [&](const auto& w, bd::kernel::Compute compute) {
    bd::kernel::GemmArguments<float, typename std::decay_t<decltype(w)>::Scalar> a;
    a.rows = 1, a.x = x.data(), a.ldx = 1, a.b = w.data(), a.ldb = K, a.out = y.data(), a.ldo = 1, a.compute = compute;
    a.segments.push_back({channels.data(), K, 0, N});
    bd::kernel::gemm(a);
    benchmark::DoNotOptimize(y.data());
  };
  const std::vector<std::function<void()>> calls{
      [&] { product(Wb[next_bf16++ % Wb.size()], bd::kernel::Compute::BF16); },
      [&] { product(W[next++ % W.size()], bd::kernel::Compute::F32); },
      [&] {
        const Bf16Matrix& w = Wb[next_bf16++ % Wb.size()];
        float total = bd_bench::read_all(reinterpret_cast<const float*>(w.data()), K * N / 2);
        benchmark::DoNotOptimize(total);
      }};
  const std::vector<double> t = bd_bench::time_interleaved(state, calls);
  state.counters["bd_bf16_GB/s"] = bytes / t[0] * 1e-9;
  state.counters["read_GB/s"] = bytes / t[2] * 1e-9;
  state.counters["bd_bf16_share_of_read"] = t[2] / t[0];
  state.counters["bf16_over_f32"] = t[0] / t[1];
}

int register_all() {
#ifdef BD_HAVE_OPENBLAS
  openblas_set_num_threads(Eigen::nbThreads());
#endif
  benchmark::RegisterBenchmark("gemv/interleaved", gemv_interleaved)
      ->Args({16384, 7168})
      ->Args({7168, 1536})
      ->Args({11008, 4096})
      ->Args({4096, 11008})
      ->Args({1536, 24576})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime()
      ->MinTime(2.0);
  benchmark::RegisterBenchmark("gemv/interleaved_bf16", gemv_interleaved_bf16)
      ->Args({16384, 7168})
      ->Args({7168, 1536})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime()
      ->MinTime(2.0);
  return 0;
}

const int registered = register_all();

}  // namespace
