// cuda_kproj/<impl>/<L> (half) and cuda_kproj_bf16/<impl>/<L>: the key projection at
// DeepSeek-V3's shape (n = 128 heads, d = 512, d_h = 128, window at 256) on a GPU:
//   cublas_dense  K = X·W, one cublasGemmEx (fp32 accumulation): the dense baseline
//   bd_kernel     the fused tensor-core kernel (bd/cuda/projection_kernel.cuh)
//   bd_cublas     window broadcast, then cublasGemmEx on each rest piece
//   bd_cublaslt   the rest's two pieces gathered into one buffer, then one batched cublasLtMatmul
//                 with the window as its C input where cuBLASLt accepts it
//                 (bd/cuda/cublaslt_projection.cuh)
//   bd_cublaslt_pieces  one batched cublasLtMatmul per piece of rest, the second in place
//   bd_hopper     the sm_90a kernel (bd/cuda/hopper_projection.cuh): wgmma and TMA, accumulators
//                 started from the window, its cluster size chosen by timing in plan()
//   bd_cublaslt_last    the window last (offset d − d_h, as nn/latent_permutation.hpp's reordered
//                 MLA latent puts it): the rest is one piece of X, one call and no gather
// Setup (buffers, handles, cuBLASLt's plan, the argument checks) happens before timing. Each
// measurement is `launches` back-to-back runs between two CUDA events, so launch latency overlaps
// as it does in a model and no host work sits inside the window; an iteration is one such batch
// (its manual time is the batch's), and us_per_call is the time of one run. A BD benchmark times the dense
// baseline in the same iteration on the same stream, alternating, and reports
//   us_per_call      microseconds per run (the batch's time over `launches`)
//   TFLOP/s          its own rate (2·(d − d_h) FLOP per output)
//   dense_TFLOP/s    cublas_dense's rate (2·d − 1 FLOP per output: the same count as the CPU table)
//   vs_cublas_dense  dense time / BD time; theoretical_ratio is the FLOP ratio, (2d − 1)/(2(d − d_h))
// Without a device every benchmark reports an error saying so.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <string>
#include <vector>

#include <bd/cuda/cublaslt_projection.cuh>
#include <bd/cuda/hopper_projection.cuh>
#include <bd/cuda/projection.cuh>

namespace {

constexpr int kHeads = 128, kD = 512, kDh = 128, kOut = kHeads * kDh, kOffset = 256;
constexpr std::size_t kWorkspaceBytes = std::size_t(32) << 20;

template <typename T>
__global__ void fill(T* p, long long n, unsigned seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const unsigned h = (unsigned(i) * 2654435761u) ^ seed;
    const float v = float(h % 2001u) / 1000.0f - 1.0f;  // uniform in [−1, 1]
    if constexpr (std::is_same_v<T, __half>) p[i] = __float2half_rn(v * 0.05f);
    else p[i] = __float2bfloat16_rn(v * 0.05f);
  }
}

/// Milliseconds for `launches` back-to-back calls of `once` on `stream`, or a negative value
/// (and the message) if a call failed.
template <typename Once>
float time_batch(Once&& once, int launches, cudaStream_t stream, cudaEvent_t start, cudaEvent_t stop, std::string& error) {
  cudaEventRecord(start, stream);
  for (int i = 0; i < launches; ++i) {
    const bd::cuda::Status s = once();
    if (!s) {
      error = s.message();
      return -1;
    }
  }
  cudaEventRecord(stop, stream);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  return ms;
}

template <typename T>
void run(benchmark::State& state, const std::string& impl) {
  if (bd::cuda::device_capability() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int L = static_cast<int>(state.range(0));
  const bool bd = impl != "cublas_dense";
  // Enough launches that one measurement lasts well over the events' resolution at small L.
  const int launches = std::max(4, 262144 / L);
  const long long nx = (long long)L * kD, nc = (long long)(kD - kDh) * kOut, nw = (long long)kD * kOut, nk = (long long)L * kOut;
  T *x = nullptr, *c = nullptr, *w = nullptr, *k = nullptr;
  void* workspace = nullptr;
  if (cudaMalloc(&x, nx * sizeof(T)) != cudaSuccess || cudaMalloc(&c, nc * sizeof(T)) != cudaSuccess ||
      cudaMalloc(&w, nw * sizeof(T)) != cudaSuccess || cudaMalloc(&k, nk * sizeof(T)) != cudaSuccess ||
      cudaMalloc(&workspace, kWorkspaceBytes) != cudaSuccess) {
    state.SkipWithError("cudaMalloc failed");
    cudaFree(x), cudaFree(c), cudaFree(w), cudaFree(k), cudaFree(workspace);
    return;
  }
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  fill<T><<<1024, 256, 0, stream>>>(x, nx, 1u);
  fill<T><<<1024, 256, 0, stream>>>(c, nc, 2u);
  fill<T><<<1024, 256, 0, stream>>>(w, nw, 3u);
  cublasHandle_t handle;
  cublasCreate(&handle);
  cublasLtHandle_t lt_handle;
  cublasLtCreate(&lt_handle);
  bd::cuda::BDProjection<T> kernel;
  bd::cuda::CublasBDProjection<T> via_cublas(handle);
  bd::cuda::CublasLtBDProjection<T> via_cublaslt(lt_handle, workspace, kWorkspaceBytes,
                                                 impl == "bd_cublaslt_pieces" ? bd::cuda::Pieces::InPlace : bd::cuda::Pieces::Gathered);
  bd::cuda::CublasDense<T> dense(handle);
  bd::cuda::HopperBDProjection<T> hopper;
  const int offset = impl == "bd_cublaslt_last" ? kD - kDh : kOffset;
  const bd::cuda::ProjectionArguments<T> args{x, c, k, L, kD, kDh, kHeads, offset};
  const bool lt = impl.rfind("bd_cublaslt", 0) == 0;
  bd::cuda::Status s = lt ? via_cublaslt.plan(args) : impl == "bd_hopper" ? hopper.plan(args) : bd::cuda::Status::success();
  const auto once_dense = [&] { return dense.run(x, w, k, L, kD, kOut, stream); };
  const auto once = [&] {
    if (impl == "cublas_dense") return once_dense();
    if (impl == "bd_kernel") return kernel.run(args, stream);
    if (impl == "bd_cublas") return via_cublas.run(args, stream);
    if (impl == "bd_hopper") return hopper.run(args, stream);
    return via_cublaslt.run(args, stream);
  };
  if (s) s = once();  // warm-up, and the arguments' check
  if (s) s = once_dense();
  if (s) s = bd::cuda::check(cudaStreamSynchronize(stream), "warm-up");
  if (!s) {
    state.SkipWithError(s.message().c_str());
  } else {
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    double total_ms = 0, dense_ms = 0;
    std::string error;
    for (auto _ : state) {
      const float ms = time_batch(once, launches, stream, start, stop, error);
      const float dms = bd ? time_batch(once_dense, launches, stream, start, stop, error) : ms;
      if (ms < 0 || dms < 0) {
        state.SkipWithError(error.c_str());
        break;
      }
      state.SetIterationTime(ms / 1e3);
      total_ms += ms, dense_ms += dms;
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    if (error.empty() && total_ms > 0) {
      const double runs = double(state.iterations()) * launches;
      const double bd_flops = double(L) * kOut * 2.0 * (kD - kDh), dense_flops = double(L) * kOut * (2.0 * kD - 1);
      state.counters["us_per_call"] = total_ms * 1e3 / runs;
      state.counters["TFLOP/s"] = (bd ? bd_flops : dense_flops) * runs / (total_ms / 1e3) / 1e12;
      state.counters["dense_TFLOP/s"] = dense_flops * runs / (dense_ms / 1e3) / 1e12;
      state.counters["vs_cublas_dense"] = dense_ms / total_ms;
      state.counters["theoretical_ratio"] = (2.0 * kD - 1) / (2.0 * (kD - kDh));
      if (impl == "bd_hopper") state.SetLabel(hopper.plan_summary());
      if (lt) state.SetLabel(std::string(via_cublaslt.window_as_c() ? "window as C" : "window broadcast") +
                             (via_cublaslt.gathers() ? ", rest gathered" : ""));
    }
  }
  cublasLtDestroy(lt_handle);
  cublasDestroy(handle);
  cudaStreamDestroy(stream);
  cudaFree(x), cudaFree(c), cudaFree(w), cudaFree(k), cudaFree(workspace);
}

int register_all() {
  for (const std::string impl : {"cublas_dense", "bd_kernel", "bd_cublas", "bd_cublaslt", "bd_cublaslt_pieces", "bd_cublaslt_last", "bd_hopper"}) {
    benchmark::RegisterBenchmark(("cuda_kproj/" + impl).c_str(), [impl](benchmark::State& s) { run<__half>(s, impl); })
        ->RangeMultiplier(4)->Range(64, 65536)->UseManualTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("cuda_kproj_bf16/" + impl).c_str(),
                                 [impl](benchmark::State& s) { run<__nv_bfloat16>(s, impl); })
        ->RangeMultiplier(4)->Range(64, 65536)->UseManualTime()->Unit(benchmark::kMicrosecond);
  }
  return 0;
}

const int registered = register_all();

}  // namespace

BENCHMARK_MAIN();
