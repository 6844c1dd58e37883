// peak/<isa>: the fp32 FMA rate bd's micro-kernel reaches on this machine when nothing waits for
// memory — the tile (MR × NR accumulators, kc = 128) run over and over on panels that stay in L1,
// on every thread (OMP_NUM_THREADS) — for each instruction set the CPU runs. It is the ceiling
// of every GEMM on that kernel: the benchmarks' GFLOP/s are read against it (and against the
// run's best GEMM, gemm/bd_kernel), so that a layer's rate says how far from the machine it is.
// peak/avx512_bf16: the same for bf16 compute's tile (vdpbf16ps on bf16 pairs), where the CPU
// has AVX512-BF16: the ceiling of bf16/* (bench_bf16.cpp).
#include <benchmark/benchmark.h>

#include <bd/kernel/context.hpp>
#include <bd/kernel/dispatch.hpp>

#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

using bd::Index;

template <typename Kernel, bool Pairs = false>
double tiles(Index calls) {
  constexpr Index MR = Kernel::mr, NR = Kernel::nr, kc = 128;
  const Index prefetch = bd::kernel::active_context().tuning.tile_prefetch;
  double flops = 0;
#ifdef _OPENMP
#pragma omp parallel reduction(+ : flops)
#endif
  {
    // A thread's packed panels (MR × kc and kc × NR: 22 KiB together for AVX-512's 32 × 12, within
    // every L1) and its tile of outputs.
    std::vector<float> A(std::size_t(MR * kc), 0.5f), B(std::size_t(kc * NR), 0.25f), out(std::size_t(MR * NR));
    float* dst[NR];
    for (Index j = 0; j < NR; ++j) dst[j] = out.data() + j * MR;
    for (Index call = 0; call < calls; ++call) {
      if constexpr (Pairs) Kernel::tile_pairs(NR, kc / 2, A.data(), B.data(), NR, nullptr, nullptr, dst, prefetch);
      else Kernel::tile(NR, kc, A.data(), B.data(), NR, nullptr, nullptr, dst, prefetch);
      benchmark::DoNotOptimize(out.data());
    }
    flops += 2.0 * double(MR * NR * kc) * double(calls);
  }
  return flops;
}

void peak(benchmark::State& state, bd::kernel::Isa isa) {
  const bd::kernel::Isa before = bd::kernel::active_isa();
  bd::kernel::use_isa(isa);
  double flops = 0;
  for (auto _ : state)
    flops = bd::kernel::on_active_kernel<float>([](auto k) { return tiles<decltype(k)>(4000); });
  bd::kernel::use_isa(before);
  state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
}

#ifdef BD_KERNEL_X86
void peak_bf16(benchmark::State& state) {
  const bd::kernel::Isa before = bd::kernel::active_isa();
  bd::kernel::use_isa(bd::kernel::Isa::AVX512);
  double flops = 0;
  for (auto _ : state) flops = tiles<bd::kernel::Avx512Kernel<float>, true>(4000);
  bd::kernel::use_isa(before);
  state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
}
#endif

const int registered = [] {
#ifdef BD_KERNEL_X86
  if (bd::kernel::cpu_has(bd::kernel::Isa::AVX512) && bd::kernel::this_cpu().avx512_bf16)
    benchmark::RegisterBenchmark("peak/avx512_bf16", peak_bf16)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif
  for (bd::kernel::Isa isa : {bd::kernel::Isa::Portable, bd::kernel::Isa::AVX2, bd::kernel::Isa::AVX512})
    if (bd::kernel::cpu_has(isa))
      benchmark::RegisterBenchmark((std::string("peak/") + bd::kernel::to_string(isa)).c_str(),
                                   [isa](benchmark::State& s) { peak(s, isa); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
  return 0;
}();

}  // namespace
