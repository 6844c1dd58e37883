// cuda_kproj/<impl>/<L> (half) and cuda_kproj_bf16/<impl>/<L>: the key projection at
// DeepSeek-V3's shape (n = 128 heads, d = 512, d_h = 128) on a GPU, timed with CUDA events:
//   cublas_dense  K = X·W, one cublasGemmEx (fp32 accumulation): the dense baseline
//   bd_kernel     the fused tensor-core kernel (bd/cuda/projection_kernel.cuh), window at 256
//   bd_cublas     the cuBLAS path: window broadcast, then cublasGemmEx on each rest piece
// Without a device every benchmark reports an error saying so.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include <bd/cuda/projection.cuh>

namespace {

constexpr int kHeads = 128, kD = 512, kDh = 128, kOut = kHeads * kDh, kOffset = 256;

template <typename T>
__global__ void fill(T* p, long long n, unsigned seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const unsigned h = (unsigned(i) * 2654435761u) ^ seed;
    const float v = float(h % 2001u) / 1000.0f - 1.0f;  // uniform in [−1, 1]
    if constexpr (std::is_same_v<T, __half>) p[i] = __float2half_rn(v * 0.05f);
    else p[i] = __float2bfloat16_rn(v * 0.05f);
  }
}

template <typename T>
void run(benchmark::State& state, const std::string& impl) {
  if (bd::cuda::device_capability() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int L = static_cast<int>(state.range(0));
  const bool bd = impl != "cublas_dense";
  const long long nx = (long long)L * kD, nw = (long long)(bd ? kD - kDh : kD) * kOut, nk = (long long)L * kOut;
  T *x = nullptr, *w = nullptr, *k = nullptr;
  if (cudaMalloc(&x, nx * sizeof(T)) != cudaSuccess || cudaMalloc(&w, nw * sizeof(T)) != cudaSuccess ||
      cudaMalloc(&k, nk * sizeof(T)) != cudaSuccess) {
    state.SkipWithError("cudaMalloc failed");
    cudaFree(x), cudaFree(w), cudaFree(k);
    return;
  }
  fill<T><<<1024, 256>>>(x, nx, 1u);
  fill<T><<<1024, 256>>>(w, nw, 2u);
  cublasHandle_t handle;
  cublasCreate(&handle);
  bd::cuda::BDProjection<T> kernel;
  bd::cuda::CublasBDProjection<T> via_cublas(handle);
  bd::cuda::CublasDense<T> dense(handle);
  const bd::cuda::ProjectionArguments<T> args{x, w, k, L, kD, kDh, kHeads, kOffset};
  const auto once = [&] {
    if (impl == "cublas_dense") return dense.run(x, w, k, L, kD, kOut);
    if (impl == "bd_kernel") return kernel.run(args);
    return via_cublas.run(args);
  };
  bd::cuda::Status s = once();  // warm-up, and the arguments' check
  if (!s) {
    state.SkipWithError(s.message().c_str());
  } else {
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    for (auto _ : state) {
      cudaEventRecord(start);
      once();
      cudaEventRecord(stop);
      cudaEventSynchronize(stop);
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      state.SetIterationTime(ms / 1e3);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    const double flops = double(L) * kOut * (bd ? 2.0 * (kD - kDh) : 2.0 * kD - 1);
    state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["theoretical_ratio"] = (2.0 * kD - 1) / (2.0 * (kD - kDh));
  }
  cublasDestroy(handle);
  cudaFree(x), cudaFree(w), cudaFree(k);
}

int register_all() {
  for (const std::string impl : {"cublas_dense", "bd_kernel", "bd_cublas"}) {
    benchmark::RegisterBenchmark(("cuda_kproj/" + impl).c_str(), [impl](benchmark::State& s) { run<__half>(s, impl); })
        ->RangeMultiplier(2)->Range(64, 65536)->UseManualTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("cuda_kproj_bf16/" + impl).c_str(),
                                 [impl](benchmark::State& s) { run<__nv_bfloat16>(s, impl); })
        ->RangeMultiplier(2)->Range(64, 65536)->UseManualTime()->Unit(benchmark::kMicrosecond);
  }
  return 0;
}

const int registered = register_all();

}  // namespace

BENCHMARK_MAIN();
