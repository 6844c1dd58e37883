// kproj/<impl>/<L> and kproj_bf16/<impl>/<L>: the key projection at DeepSeek-V3's shape
// (n = 128 heads, d = 512, d_h = 128): K = X·W (L × 16384) dense, against BD's
// K'_h = X[:, window] + X[:, rest]·C_h. Every implementation runs in the same executable with
// the same threads and precision; the comparison is against the fastest dense one of the run.
//   dense_eigen     one Eigen GEMM (multithreaded by Eigen)
//   dense_blocked   Eigen GEMM on the same row × column tiles as BD, tiles in parallel
//   dense_openblas  one cblas_sgemm (when OpenBLAS was found)
//   dense_blis      one bli_sgemm (when BLIS was found)
//   dense_kernel    bd::kernel::gemm on all 512 channels from zero: BD's own packed kernel
//                   doing the dense product, the same craft on both sides
//   bd              the fused BD kernel, a shared window at offset 256 (so rest is two pieces)
//   bd_pivoted      the same with a per-head pivoted basis (gathered while packing)
// kproj_bf16: weights stored in bfloat16, activations and accumulation in float; dense
// baselines convert W one block (dense_blocked) or one panel (dense_kernel) at a time, like BD.
// kproj_cpu_<isa>/<dense_kernel|bd>/<L>: bd's kernels forced to each instruction set this CPU
// runs (the BD_CPU sweep, in one run), at the lengths the targets name.
// kproj/interleaved/<L>: dense_kernel, bd and dense_openblas called in turn within one benchmark
// (interleaved.hpp), each one's median and their ratios: the figure to compare, where the
// separate benchmarks above may each meet a different spell of a shared machine; paired_*: the
// median of each iteration's own ratio (interleaved.hpp's paired_ratio).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <bd/kernel/gemm.hpp>
#include <bd/nn/projection.hpp>

#ifdef BD_HAVE_OPENBLAS
#include <cblas.h>
#endif
#ifdef BD_HAVE_BLIS
#include "blis_baseline.hpp"
#endif
#include "interleaved.hpp"

namespace {

constexpr Eigen::Index kHeads = 128, kD = 512, kDh = 128, kOut = kHeads * kDh, kOffset = 256;
const bd::kernel::Blocking kBlocking{};  // bd, bd_pivoted and dense_kernel

const Eigen::MatrixXf& input(Eigen::Index L) {
  static std::map<Eigen::Index, Eigen::MatrixXf> cache;
  auto it = cache.find(L);
  if (it == cache.end()) it = cache.emplace(L, Eigen::MatrixXf::Random(L, kD)).first;
  return it->second;
}

/// Decoding reads the weights from memory, not from a cache that still holds them from the
/// previous call: at L ≤ 4 every iteration takes the next of enough copies to exceed 256 MB (far
/// more than this class of machine's L3), so dense and BD both stream their weights from DRAM.
int copies(Eigen::Index L, std::size_t bytes) { return L <= 4 ? int(256e6 / double(bytes)) + 1 : 1; }

/// Copy `i` of the dense W (d × n·d_h) or of BD's C ((d − d_h) × n·d_h), stored in S.
template <typename S>
const Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>& weights(bool bd, int i) {
  static std::vector<Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>> dense, coeff;
  auto& set = bd ? coeff : dense;
  while (int(set.size()) <= i) set.push_back(Eigen::MatrixXf::Random(bd ? kD - kDh : kD, kOut).cast<S>());
  return set[std::size_t(i)];
}

const bd::nn::HeadIndices& pivoted_indices() {
  static const bd::nn::HeadIndices idx = [] {
    std::mt19937 rng(3);
    std::vector<std::vector<Eigen::Index>> basis;
    std::vector<Eigen::Index> all(kD);
    std::iota(all.begin(), all.end(), 0);
    for (Eigen::Index h = 0; h < kHeads; ++h) {
      std::shuffle(all.begin(), all.end(), rng);
      std::vector<Eigen::Index> s(all.begin(), all.begin() + kDh);
      std::sort(s.begin(), s.end());
      basis.push_back(s);
    }
    return bd::nn::HeadIndices::from_basis(basis, kD);
  }();
  return idx;
}

/// The paper's count: 2d − 1 per dense output, 2(d − d_h) per BD output.
double kproj_flops(Eigen::Index L, bool bd) { return double(L) * kOut * (bd ? 2.0 * (kD - kDh) : 2.0 * kD - 1); }
const double kTheory = kproj_flops(1, false) / kproj_flops(1, true);

void counters(benchmark::State& state, Eigen::Index L, bool bd) {
  state.counters["FLOP/s"] = benchmark::Counter(kproj_flops(L, bd), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["theoretical_ratio"] = kTheory;
}

/// Dense K = X·W on BD's tiles, W converted per column block when stored narrow.
template <typename S>
void dense_blocked(const Eigen::MatrixXf& X, const Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>& W, Eigen::MatrixXf& K) {
  // 128 × 256 tiles: the fastest for Eigen's GEMM on this shape (kOut % cols == 0).
  const Eigen::Index L = X.rows(), rows = 128, cols = 256;
  const Eigen::Index row_blocks = (L + rows - 1) / rows, col_blocks = kOut / cols;
#pragma omp parallel
  {
    Eigen::MatrixXf buffer;
    Eigen::Index converted = -1;
#pragma omp for schedule(static)
    for (Eigen::Index t = 0; t < row_blocks * col_blocks; ++t) {
      const Eigen::Index cb = t / row_blocks, r0 = (t % row_blocks) * rows, n = std::min(rows, L - r0);
      if constexpr (std::is_same_v<S, float>) {
        K.block(r0, cb * cols, n, cols).noalias() = X.middleRows(r0, n) * W.middleCols(cb * cols, cols);
      } else {
        if (converted != cb) buffer = W.middleCols(cb * cols, cols).template cast<float>(), converted = cb;
        K.block(r0, cb * cols, n, cols).noalias() = X.middleRows(r0, n) * buffer;
      }
    }
  }
}

/// Dense K = X·W on bd::kernel::gemm: every channel, accumulators from zero.
template <typename S>
void dense_kernel(const Eigen::MatrixXf& X, const Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>& W, Eigen::MatrixXf& K) {
  static const std::vector<Eigen::Index> all = [] {
    std::vector<Eigen::Index> c(kD);
    std::iota(c.begin(), c.end(), 0);
    return c;
  }();
  bd::kernel::GemmArguments<float, S> a;
  a.rows = X.rows(), a.x = X.data(), a.ldx = X.rows();
  a.b = W.data(), a.ldb = kD, a.out = K.data(), a.ldo = K.rows();
  a.segments.push_back({all.data(), kD, 0, kOut});
  bd::kernel::gemm(a, kBlocking);
}

/// The output K (L × n·d_h), every page written before the timing starts. Not Zero(): a fresh
/// allocation followed by zeros can compile to calloc, whose pages the kernel maps only when
/// first written — inside the timed call (at L = 4096, 268 MB: 65536 page faults, which a
/// virtual machine's hypervisor made cost two thirds of the call's 0.6 s).
Eigen::MatrixXf touched_output(Eigen::Index L) {
  Eigen::MatrixXf K(L, kOut);
  K.setConstant(1.0f);
  benchmark::DoNotOptimize(K.data());
  return K;
}

/// One call of `impl` at L rows, writing K: a closure over its inputs (each call takes the next
/// copy of the weights, see copies()).
template <typename S>
std::function<void()> kproj_call(const std::string& impl, Eigen::Index L, Eigen::MatrixXf& K) {
  const Eigen::MatrixXf& X = input(L);
  const bool bd = impl == "bd" || impl == "bd_pivoted";
  const int n_copies = copies(L, std::size_t((bd ? kD - kDh : kD) * kOut) * sizeof(S));
  for (int i = 0; i < n_copies; ++i) weights<S>(bd, i);
  return [impl, L, bd, n_copies, &X, &K, next = 0]() mutable {
    const auto& M = weights<S>(bd, next);
    next = (next + 1) % n_copies;
    // fp32 baselines multiply W as stored; the BLAS and Eigen ones are registered for fp32 only.
    const float* W_float = nullptr;
    if constexpr (std::is_same_v<S, float>) W_float = M.data();
    (void)W_float, (void)L;
    if (impl == "dense_eigen") {
      if constexpr (std::is_same_v<S, float>) K.noalias() = X * M;
    } else if (impl == "dense_blocked") {
      dense_blocked<S>(X, M, K);
    } else if (impl == "dense_kernel") {
      dense_kernel<S>(X, M, K);
    } else if (impl == "dense_openblas") {
#ifdef BD_HAVE_OPENBLAS
      // Row-major view of column-major data: K^T = W^T·X^T.
      cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, int(L), int(kOut), int(kD), 1.0f, X.data(), int(L), W_float,
                  int(kD), 0.0f, K.data(), int(L));
#endif
    } else if (impl == "dense_blis") {
#ifdef BD_HAVE_BLIS
      bd_bench::blis_sgemm(L, kOut, kD, X.data(), L, W_float, kD, K.data(), L);
#endif
    } else if (impl == "bd") {
      static const bd::nn::HeadIndices window = bd::nn::HeadIndices::window(kD, kDh, kOffset, kHeads);
      bd::nn::bd_project_into<float, S>(X, window, M, K, kBlocking);
    } else {
      bd::nn::bd_project_into<float, S>(X, pivoted_indices(), M, K, kBlocking);
    }
    benchmark::DoNotOptimize(K.data());
    benchmark::ClobberMemory();
  };
}

template <typename S>
void run(benchmark::State& state, const std::string& impl) {
  const Eigen::Index L = state.range(0);
  Eigen::MatrixXf K = touched_output(L);
  const std::function<void()> call = kproj_call<S>(impl, L, K);
  for (auto _ : state) call();
  counters(state, L, impl == "bd" || impl == "bd_pivoted");
}

/// kproj/interleaved/<L>: dense on bd's kernel, BD, and OpenBLAS (where built), one call each per
/// iteration in balanced orders (interleaved.hpp; OpenBLAS settles, untimed, after its call):
/// their medians from the same seconds, and the ratios the targets are stated in.
void interleaved(benchmark::State& state) {
  const Eigen::Index L = state.range(0);
  Eigen::MatrixXf K = touched_output(L);
  std::vector<std::function<void()>> calls{kproj_call<float>("dense_kernel", L, K), kproj_call<float>("bd", L, K)};
  std::vector<double> settle;
#ifdef BD_HAVE_OPENBLAS
  calls.push_back(kproj_call<float>("dense_openblas", L, K));
  settle = {0, 0, bd_bench::kOpenBlasSettleSeconds};
#endif
  std::vector<std::vector<double>> seconds;
  const std::vector<double> t = bd_bench::time_interleaved(state, calls, settle, &seconds);
  state.counters["dense_kernel_ms"] = t[0] * 1e3;
  state.counters["bd_ms"] = t[1] * 1e3;
  state.counters["dense_kernel_GFLOP/s"] = kproj_flops(L, false) / t[0] * 1e-9;
  state.counters["speedup"] = t[0] / t[1];  // BD against its dense twin on bd's kernel
  state.counters["theoretical_ratio"] = kTheory;
  state.counters["share_of_theory"] = t[0] / t[1] / kTheory;
  state.counters["paired_speedup"] = bd_bench::paired_ratio(seconds[0], seconds[1]);
#ifdef BD_HAVE_OPENBLAS
  state.counters["openblas_ms"] = t[2] * 1e3;
  state.counters["kernel_vs_openblas"] = t[2] / t[0];  // bd's dense kernel against OpenBLAS, same product
  // The same from each iteration's pair of calls (interleaved.hpp's paired_ratio).
  state.counters["paired_kernel_vs_openblas"] = bd_bench::paired_ratio(seconds[2], seconds[0]);
  state.counters["bd_vs_openblas"] = t[2] / t[1];
#endif
}

void lengths(benchmark::internal::Benchmark* b) {
  // 1 and 4: decoding (one token, or a few draft tokens, per step), where the projection streams
  // its weights once and the gain is the bytes BD does not read; then the paper's lengths.
  // Those two read their weights from memory every call (see copies()).
  for (Eigen::Index L : {1, 4}) b->Arg(L);
  for (Eigen::Index L = 64; L <= 65536; L *= 2) b->Arg(L);
  b->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
}

int register_all() {
#ifdef BD_HAVE_OPENBLAS
  openblas_set_num_threads(Eigen::nbThreads());
#endif
  std::vector<std::string> impls{"dense_eigen", "dense_blocked"};
#ifdef BD_HAVE_OPENBLAS
  impls.push_back("dense_openblas");
#else
  std::fprintf(stderr, "bd_bench: built without OpenBLAS (Debian: libopenblas-dev); kproj/dense_openblas is skipped\n");
#endif
#ifdef BD_HAVE_BLIS
  bd_bench::blis_set_threads(Eigen::nbThreads());
  impls.push_back("dense_blis");
#endif
  impls.push_back("dense_kernel");
  impls.push_back("bd");
  impls.push_back("bd_pivoted");
  for (const auto& impl : impls)
    benchmark::RegisterBenchmark(("kproj/" + impl).c_str(), [impl](benchmark::State& s) { run<float>(s, impl); })->Apply(lengths);
  benchmark::RegisterBenchmark("kproj/interleaved", interleaved)
      ->Arg(4)->Arg(1024)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
  // bf16 storage: whole-matrix conversion for one GEMM would be the materialised copy the kernels
  // avoid, so the bf16 dense baseline is the blocked one with per-block conversion.
  for (const std::string impl : {"dense_blocked", "dense_kernel", "bd", "bd_pivoted"})
    benchmark::RegisterBenchmark(("kproj_bf16/" + impl).c_str(), [impl](benchmark::State& s) { run<Eigen::bfloat16>(s, impl); })
        ->Apply(lengths);
  for (bd::kernel::Isa isa : {bd::kernel::Isa::Portable, bd::kernel::Isa::AVX2, bd::kernel::Isa::AVX512}) {
    if (!bd::kernel::cpu_has(isa)) continue;
    for (const std::string impl : {"dense_kernel", "bd"}) {
      const std::string name = std::string("kproj_cpu_") + bd::kernel::to_string(isa) + "/" + impl;
      benchmark::RegisterBenchmark(name.c_str(), [impl, isa](benchmark::State& s) {
        const bd::kernel::Isa before = bd::kernel::active_isa();
        bd::kernel::use_isa(isa);
        run<float>(s, impl);
        bd::kernel::use_isa(before);
      })->Arg(4)->Arg(256)->Arg(1024)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
    }
  }
  return 0;
}

const int registered = register_all();

}  // namespace
