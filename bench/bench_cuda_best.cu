// cuda_kproj_best/<type>/<L>: the BD key projection against the best dense GEMM cuBLASLt has for
// it, at DeepSeek-V3's shape (n = 128 heads, d = 512, d_h = 128, window at 256), fp16 and bf16.
//
// The dense baseline is tuned as a user who cares would tune it: every algorithm cuBLASLt's
// heuristics offer (up to 32), for both weight layouts — W stored d × N (K = X·W) and N × d
// (K = X·Wᵀ) — each timed (median of 5 after 2 warm-ups) and the fastest kept; split-K
// reductions held to fp32, as for the BD paths. cuBLAS's default choice (cublasGemmEx, what the
// paper compared with) is reported beside it. BD paths: HopperBDProjection in each configuration
// (cluster 1, 2, 4 × 3, 4 stages × staged or direct stores: us_bd_hopper_c<cluster>s<stages>, a
// trailing d for direct) and as plan() chooses by timing (us_bd_hopper, the figure the ratios use); CublasLtBDProjection (gathered). Every path is planned
// and warmed before timing; then R = 7 rounds, each timing every path once in turn, each call
// preceded by an L2 flush (a 2 × L2 memset) and bracketed by its own CUDA events; medians.
// Counters: us_* (median µs per call), speedup (best dense / BD chosen by plan), vs_cublas_default,
// TFLOP/s (each path's own FLOPs: L·N·2(d − d_h) for BD, L·N·(2d − 1) dense, the CPU tables'
// count), pct_of_ceiling (of a timed 8192³ product of the same type, best of its algorithms),
// write_GB/s (K' bytes over BD's time), tokens/s, and max_rel_diff (BD Hopper against the
// cuBLASLt BD path on the first and last 64 rows: a sanity check that the timed kernel computes).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <bd/cuda/cublaslt_projection.cuh>
#include <bd/cuda/hopper_projection.cuh>
#include <bd/cuda/projection.cuh>

namespace {

constexpr int kHeads = 128, kD = 512, kDh = 128, kN = kHeads * kDh, kOffset = 256, kRounds = 7;
constexpr std::size_t kWorkspaceBytes = std::size_t(32) << 20;

template <typename T>
__global__ void fill_random(T* p, long long n, unsigned seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    unsigned h = (unsigned(i) * 2654435761u) ^ seed;
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    const float v = (float(h % 2001u) / 1000.0f - 1.0f) * 0.05f;  // uniform in [−0.05, 0.05], never all zeros
    if constexpr (std::is_same_v<T, __half>) p[i] = __float2half_rn(v);
    else p[i] = __float2bfloat16_rn(v);
  }
}

template <typename T>
float median(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.f : float(v[v.size() / 2]);
}

/// A dense GEMM D (column-major N × L, ld N) = op(A) · X (column-major d × L) on cuBLASLt, with
/// every heuristic algorithm timed and the fastest kept.
template <typename T>
class TunedDense {
public:
  /// `transposed`: W stored N × d row-major (column-major d × N, op T); else d × N (op N).
  TunedDense(cublasLtHandle_t handle, void* workspace, bool transposed, int L, std::string& error)
      : handle_(handle), workspace_(workspace), L_(L) {
    const auto type = bd::cuda::DataType<T>::value;
    bool ok = cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
    const cublasOperation_t ta = transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    ok = ok && cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS;
    ok = ok && (transposed ? cublasLtMatrixLayoutCreate(&a_, type, kD, kN, kD) : cublasLtMatrixLayoutCreate(&a_, type, kN, kD, kN)) ==
                   CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatrixLayoutCreate(&b_, type, kD, L, kD) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatrixLayoutCreate(&d_, type, kN, L, kN) == CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulPreference_t pref = nullptr;
    ok = ok && cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
    const std::uint64_t bytes = kWorkspaceBytes;
    const std::uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof bytes) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions, sizeof reductions) ==
                   CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulHeuristicResult_t results[32];
    int returned = 0;
    ok = ok && cublasLtMatmulAlgoGetHeuristic(handle_, op_, a_, b_, d_, d_, pref, 32, results, &returned) == CUBLAS_STATUS_SUCCESS;
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    for (int i = 0; ok && i < returned; ++i)
      if (results[i].state == CUBLAS_STATUS_SUCCESS) algos_.push_back(results[i].algo);
    if (!ok || algos_.empty()) error = std::string("cuBLASLt offered no dense algorithm (") + (transposed ? "W N × d" : "W d × N") + ")";
  }
  ~TunedDense() {
    if (d_) cublasLtMatrixLayoutDestroy(d_);
    if (b_) cublasLtMatrixLayoutDestroy(b_);
    if (a_) cublasLtMatrixLayoutDestroy(a_);
    if (op_) cublasLtMatmulDescDestroy(op_);
  }
  TunedDense(const TunedDense&) = delete;
  TunedDense& operator=(const TunedDense&) = delete;

  bd::cuda::Status run(const T* w, const T* x, T* out, cudaStream_t stream, int algo = -1) const {
    const float one = 1.0f, zero = 0.0f;
    return bd::cuda::check(cublasLtMatmul(handle_, op_, &one, w, a_, x, b_, &zero, out, d_, out, d_, &algos_[algo < 0 ? best_ : algo],
                                          workspace_, kWorkspaceBytes, stream),
                           "cublasLtMatmul (dense)");
  }
  /// Times every algorithm (median of 5 after 2 warm-ups, back to back) and keeps the fastest.
  bd::cuda::Status tune(const T* w, const T* x, T* out, cudaStream_t stream, cudaEvent_t start, cudaEvent_t stop) {
    float best = 1e30f;
    for (int i = 0; i < int(algos_.size()); ++i) {
      std::vector<float> ms;
      bool ok = true;
      for (int r = 0; r < 7 && ok; ++r) {
        cudaEventRecord(start, stream);
        ok = run(w, x, out, stream, i).ok();
        cudaEventRecord(stop, stream);
        cudaEventSynchronize(stop);
        float t = 0;
        cudaEventElapsedTime(&t, start, stop);
        if (r >= 2) ms.push_back(t);
      }
      if (!ok) continue;  // an algorithm the heuristics offered but that refuses to run: not a candidate
      const float m = median(ms);
      if (m < best) best = m, best_ = i;
    }
    candidates_ = int(algos_.size());
    return best < 1e30f ? bd::cuda::Status::success() : bd::cuda::Status::failure("no dense algorithm ran");
  }
  int candidates() const { return candidates_; }

private:
  cublasLtHandle_t handle_;
  void* workspace_;
  int L_;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  std::vector<cublasLtMatmulAlgo_t> algos_;
  int best_ = 0, candidates_ = 0;
};

/// TFLOP/s of the best cuBLASLt algorithm on an 8192³ product of T: the ceiling the table's
/// percentages are of. Measured once per type.
template <typename T>
double ceiling_tflops(cublasLtHandle_t handle, void* workspace, cudaStream_t stream) {
  static double cached = 0;
  if (cached > 0) return cached;
  constexpr int n = 8192;
  T *a = nullptr, *b = nullptr, *c = nullptr;
  if (cudaMalloc(&a, sizeof(T) * n * n) != cudaSuccess || cudaMalloc(&b, sizeof(T) * n * n) != cudaSuccess ||
      cudaMalloc(&c, sizeof(T) * n * n) != cudaSuccess) {
    cudaFree(a), cudaFree(b), cudaFree(c);
    return 0;
  }
  fill_random<T><<<1024, 256, 0, stream>>>(a, (long long)n * n, 11u);
  fill_random<T><<<1024, 256, 0, stream>>>(b, (long long)n * n, 12u);
  const auto type = bd::cuda::DataType<T>::value;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t l;
  cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasLtMatrixLayoutCreate(&l, type, n, n, n);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  const std::uint64_t bytes = kWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof bytes);
  cublasLtMatmulHeuristicResult_t results[8];
  int returned = 0;
  cublasLtMatmulAlgoGetHeuristic(handle, op, l, l, l, l, pref, 8, results, &returned);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const float one = 1.0f, zero = 0.0f;
  float best = 1e30f;
  for (int i = 0; i < returned; ++i) {
    std::vector<float> ms;
    for (int r = 0; r < 7; ++r) {
      cudaEventRecord(start, stream);
      const bool ok = cublasLtMatmul(handle, op, &one, a, l, b, l, &zero, c, l, c, l, &results[i].algo, workspace, kWorkspaceBytes,
                                     stream) == CUBLAS_STATUS_SUCCESS;
      cudaEventRecord(stop, stream);
      cudaEventSynchronize(stop);
      float t = 0;
      cudaEventElapsedTime(&t, start, stop);
      if (ok && r >= 2) ms.push_back(t);
    }
    if (!ms.empty()) best = std::min(best, median(ms));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(op);
  cudaFree(a), cudaFree(b), cudaFree(c);
  cached = best < 1e30f ? 2.0 * n * n * double(n) / (best * 1e-3) / 1e12 : 0;
  return cached;
}

template <typename T>
float to_float(T v) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else return __bfloat162float(v);
}

template <typename T>
void run(benchmark::State& state) {
  if (bd::cuda::device_capability() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int L = static_cast<int>(state.range(0));
  const long long nx = (long long)L * kD, nw = (long long)kD * kN, nc = (long long)(kD - kDh) * kN, nk = (long long)L * kN;
  int l2_bytes = 0;
  cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, bd::cuda::DeviceInfo::current().ordinal);
  const std::size_t flush_bytes = std::max<std::size_t>(std::size_t(2) * l2_bytes, std::size_t(64) << 20);
  T *x = nullptr, *w = nullptr, *wt = nullptr, *c = nullptr, *k = nullptr, *k_ref = nullptr;
  void *workspace = nullptr, *flush = nullptr;
  if (cudaMalloc(&x, nx * sizeof(T)) != cudaSuccess || cudaMalloc(&w, nw * sizeof(T)) != cudaSuccess ||
      cudaMalloc(&wt, nw * sizeof(T)) != cudaSuccess || cudaMalloc(&c, nc * sizeof(T)) != cudaSuccess ||
      cudaMalloc(&k, nk * sizeof(T)) != cudaSuccess || cudaMalloc(&k_ref, nk * sizeof(T)) != cudaSuccess ||
      cudaMalloc(&workspace, kWorkspaceBytes) != cudaSuccess || cudaMalloc(&flush, flush_bytes) != cudaSuccess) {
    state.SkipWithError("cudaMalloc failed");
    cudaFree(x), cudaFree(w), cudaFree(wt), cudaFree(c), cudaFree(k), cudaFree(k_ref), cudaFree(workspace), cudaFree(flush);
    return;
  }
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  fill_random<T><<<1024, 256, 0, stream>>>(x, nx, 1u);
  fill_random<T><<<1024, 256, 0, stream>>>(w, nw, 2u);
  fill_random<T><<<1024, 256, 0, stream>>>(wt, nw, 3u);
  fill_random<T><<<1024, 256, 0, stream>>>(c, nc, 4u);
  cublasHandle_t handle;
  cublasCreate(&handle);
  cublasLtHandle_t lt;
  cublasLtCreate(&lt);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::string error;
  {
    TunedDense<T> dense_dn(lt, workspace, false, L, error), dense_nd(lt, workspace, true, L, error);
    bd::cuda::CublasDense<T> dense_default(handle);
    bd::cuda::HopperBDProjection<T> hopper;
    const bd::cuda::HopperConfig configs[] = {{1, 3, 1}, {2, 3, 1}, {4, 3, 1}, {1, 4, 1}, {2, 4, 1}, {4, 4, 1},
                                              {1, 3, 2}, {2, 3, 2}, {4, 3, 2}, {1, 4, 2}, {2, 4, 2}, {4, 4, 2}};
    std::vector<std::unique_ptr<bd::cuda::HopperBDProjection<T>>> fixed;
    bd::cuda::CublasLtBDProjection<T> bd_lt(lt, workspace, kWorkspaceBytes);
    const bd::cuda::ProjectionArguments<T> args{x, c, k, L, kD, kDh, kHeads, kOffset};
    const bd::cuda::ProjectionArguments<T> ref_args{x, c, k_ref, L, kD, kDh, kHeads, kOffset};
    bd::cuda::Status s = error.empty() ? bd::cuda::Status::success() : bd::cuda::Status::failure(error);
    if (s) s = dense_dn.tune(w, x, k, stream, start, stop);
    if (s) s = dense_nd.tune(wt, x, k, stream, start, stop);
    for (const auto& config : configs) {
      fixed.push_back(std::make_unique<bd::cuda::HopperBDProjection<T>>());
      if (s) s = fixed.back()->plan(args, config, stream);
    }
    if (s) s = hopper.plan(args, {}, stream);
    if (s) s = bd_lt.plan(ref_args);
    struct Path {
      const char* name;
      std::function<bd::cuda::Status()> call;
      std::vector<float> ms;
    };
    std::vector<Path> paths = {
        {"dense_dn", [&] { return dense_dn.run(w, x, k, stream); }, {}},
        {"dense_nd", [&] { return dense_nd.run(wt, x, k, stream); }, {}},
        {"cublas_default", [&] { return dense_default.run(x, w, k, L, kD, kN, stream); }, {}},
        {"bd_hopper", [&] { return hopper.run(args, stream); }, {}},
        {"bd_cublaslt", [&] { return bd_lt.run(ref_args, stream); }, {}},
    };
    static const char* names[] = {"bd_hopper_c1s3",  "bd_hopper_c2s3",  "bd_hopper_c4s3",  "bd_hopper_c1s4",
                                  "bd_hopper_c2s4",  "bd_hopper_c4s4",  "bd_hopper_c1s3d", "bd_hopper_c2s3d",
                                  "bd_hopper_c4s3d", "bd_hopper_c1s4d", "bd_hopper_c2s4d", "bd_hopper_c4s4d"};
    for (std::size_t i = 0; i < fixed.size(); ++i)
      paths.push_back({names[i], [&, i] { return fixed[i]->run(args, stream); }, {}});
    for (Path& path : paths)  // warm-up
      if (s) s = path.call();
    if (s) s = bd::cuda::check(cudaStreamSynchronize(stream), "warm-up");
    for (int round = 0; round < kRounds && s; ++round)
      for (Path& path : paths) {
        cudaMemsetAsync(flush, round & 0xFF, flush_bytes, stream);  // evict X, W, C and K' from L2
        cudaEventRecord(start, stream);
        s = path.call();
        cudaEventRecord(stop, stream);
        if (s) s = bd::cuda::check(cudaEventSynchronize(stop), path.name);
        float t = 0;
        cudaEventElapsedTime(&t, start, stop);
        path.ms.push_back(t);
        if (!s) break;
      }
    // Sanity: the last Hopper run and the cuBLASLt BD run computed the same K' (first and last 64 rows).
    double max_rel = 0;
    if (s) {
      s = hopper.run(args, stream);
      if (s) s = bd_lt.run(ref_args, stream);
      if (s) s = bd::cuda::check(cudaStreamSynchronize(stream), "sanity runs");
      const long long rows = std::min(L, 64);
      std::vector<T> a(std::size_t(rows) * kN), b(a.size());
      for (long long r0 : {0LL, (long long)L - rows}) {
        cudaMemcpy(a.data(), k + r0 * kN, a.size() * sizeof(T), cudaMemcpyDeviceToHost);
        cudaMemcpy(b.data(), k_ref + r0 * kN, b.size() * sizeof(T), cudaMemcpyDeviceToHost);
        for (std::size_t i = 0; i < a.size(); ++i) {
          const double u = to_float(a[i]), v = to_float(b[i]);
          const double rel = std::fabs(u - v) / std::max(std::fabs(v), 1e-2);
          max_rel = std::isfinite(u) ? std::max(max_rel, rel) : 1e30;
        }
      }
    }
    if (!s) {
      state.SkipWithError(s.message().c_str());
    } else {
      const double ceiling = ceiling_tflops<T>(lt, workspace, stream);
      for (auto _ : state) state.SetIterationTime(median(paths[3].ms) * 1e-3);
      const auto us = [&](int i) { return double(median(paths[i].ms)) * 1e3; };
      const double dense_best = std::min(us(0), us(1)), bd = us(3);
      const double bd_flops = double(L) * kN * 2.0 * (kD - kDh), dense_flops = double(L) * kN * (2.0 * kD - 1);
      for (int i = 0; i < int(paths.size()); ++i) state.counters[std::string("us_") + paths[i].name] = us(i);
      state.counters["us_dense_best"] = dense_best;
      state.counters["speedup"] = dense_best / bd;
      double best_bd = us(3);
      for (int i = 4; i < int(paths.size()); ++i) best_bd = std::min(best_bd, us(i));
      state.counters["best_bd_speedup"] = dense_best / best_bd;
      state.counters["vs_cublas_default"] = us(2) / bd;
      state.counters["theoretical_ratio"] = (2.0 * kD - 1) / (2.0 * (kD - kDh));
      state.counters["TFLOP/s"] = bd_flops / (bd * 1e-6) / 1e12;
      state.counters["dense_TFLOP/s"] = dense_flops / (dense_best * 1e-6) / 1e12;
      state.counters["ceiling_TFLOP/s"] = ceiling;
      state.counters["pct_of_ceiling"] = ceiling > 0 ? 100.0 * bd_flops / (bd * 1e-6) / 1e12 / ceiling : 0;
      state.counters["dense_pct_of_ceiling"] = ceiling > 0 ? 100.0 * dense_flops / (dense_best * 1e-6) / 1e12 / ceiling : 0;
      state.counters["write_GB/s"] = double(nk) * sizeof(T) / (bd * 1e-6) / 1e9;
      state.counters["tokens/s"] = double(L) / (bd * 1e-6);
      state.counters["dense_algorithms"] = dense_dn.candidates() + dense_nd.candidates();
      state.counters["max_rel_diff"] = max_rel;
      state.SetLabel(hopper.plan_summary());
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cublasLtDestroy(lt);
  cublasDestroy(handle);
  cudaStreamDestroy(stream);
  cudaFree(x), cudaFree(w), cudaFree(wt), cudaFree(c), cudaFree(k), cudaFree(k_ref), cudaFree(workspace), cudaFree(flush);
}

int register_best() {
  for (int L : {256, 1024, 4096, 16384, 65536}) {
    benchmark::RegisterBenchmark(("cuda_kproj_best/half/" + std::to_string(L)).c_str(), [](benchmark::State& s) { run<__half>(s); })
        ->Arg(L)->Iterations(1)->UseManualTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("cuda_kproj_best/bf16/" + std::to_string(L)).c_str(),
                                 [](benchmark::State& s) { run<__nv_bfloat16>(s); })
        ->Arg(L)->Iterations(1)->UseManualTime()->Unit(benchmark::kMicrosecond);
  }
  return 0;
}

const int registered_best = register_best();

}  // namespace
