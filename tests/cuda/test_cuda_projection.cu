// The BD projection on a GPU equals the CPU reference
//     K'[l, h·d_h + j] = X[l, o + j] + Σ_k X[l, rest(k)]·C[k, h·d_h + j]
// for every window position (multiples of 8), odd L, L not a multiple of the 128-row tile,
// n·d_h not a multiple of the 128-column tile, half and bfloat16, through the tensor-core kernel
// and through cuBLAS; and can_implement/run refuse what they cannot do, with the reason.
// Without a CUDA device it prints why and exits 77, which ctest reports as skipped.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <bd/cuda/projection.cuh>

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::printf("FAILED: %s\n", what.c_str());
  }
}

template <typename T>
float to_float(T v) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else return __bfloat162float(v);
}
template <typename T>
T from_float(float v) {
  if constexpr (std::is_same_v<T, __half>) return __float2half_rn(v);
  else return __float2bfloat16_rn(v);
}
/// Unit roundoff of T: the output is rounded once to it.
template <typename T>
double unit_roundoff() {
  return std::is_same_v<T, __half> ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
}

template <typename T>
struct Device {
  T* p = nullptr;
  explicit Device(std::size_t n) { cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)); }
  ~Device() { cudaFree(p); }
};

template <typename T, typename Impl>
void check(const char* name, Impl& impl, int L, int d, int dh, int n, int o, unsigned seed) {
  const int N = n * dh, K = d - dh;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<T> x(std::size_t(L) * d), c(std::size_t(K) * N), out(std::size_t(L) * N);
  for (auto& v : x) v = from_float<T>(normal(rng));
  for (auto& v : c) v = from_float<T>(normal(rng) / std::sqrt(float(K)));
  Device<T> dx(x.size()), dc(c.size()), dout(out.size());
  cudaMemcpy(dx.p, x.data(), x.size() * sizeof(T), cudaMemcpyHostToDevice);
  cudaMemcpy(dc.p, c.data(), c.size() * sizeof(T), cudaMemcpyHostToDevice);
  bd::cuda::ProjectionArguments<T> a{dx.p, dc.p, dout.p, L, d, dh, n, o};
  const bd::cuda::Status s = impl.run(a);
  const bd::cuda::Status synced = bd::cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const std::string where = std::string(name) + " " + bd::cuda::DataType<T>::name + " L=" + std::to_string(L) + " d=" +
                            std::to_string(d) + " d_h=" + std::to_string(dh) + " n=" + std::to_string(n) + " o=" + std::to_string(o);
  expect(s.ok() && synced.ok(), where + ": " + s.message() + synced.message());
  if (!s.ok() || !synced.ok()) return;
  cudaMemcpy(out.data(), dout.p, out.size() * sizeof(T), cudaMemcpyDeviceToHost);
  // Bound: one rounding to T of the result (u_T·|ref|) plus fp32 accumulation over K + 1 terms
  // ((K + 1)·2^-24·Σ|terms|, doubled for the order cuBLAS or the kernel chooses).
  double worst = 0;
  for (int l = 0; l < L; ++l)
    for (int col = 0; col < N; ++col) {
      double ref = to_float(x[std::size_t(l) * d + o + col % dh]), mag = std::fabs(ref);
      for (int k = 0; k < K; ++k) {
        const int ch = k < o ? k : k + dh;
        const double term = double(to_float(x[std::size_t(l) * d + ch])) * to_float(c[std::size_t(k) * N + col]);
        ref += term, mag += std::fabs(term);
      }
      const double err = std::fabs(double(to_float(out[std::size_t(l) * N + col])) - ref);
      const double bound = unit_roundoff<T>() * std::fabs(ref) + 2.0 * (K + 1) * std::ldexp(1.0, -24) * mag + 1e-30;
      worst = std::max(worst, err / bound);
    }
  expect(worst <= 1.0, where + ": error " + std::to_string(worst) + " × the bound");
}

template <typename T>
void suite(cublasHandle_t handle) {
  bd::cuda::BDProjection<T> kernel;
  bd::cuda::CublasBDProjection<T> cublas(handle);
  for (int o = 0; o + 16 <= 64; o += 8) {  // every window position of a 64-wide input, d_h = 16
    for (int L : {1, 7, 130}) {
      check<T>("kernel", kernel, L, 64, 16, 9, o, unsigned(L * 100 + o));  // n·d_h = 144: a partial column tile
      check<T>("cublas", cublas, L, 64, 16, 9, o, unsigned(L * 100 + o + 1));
    }
  }
  for (int o : {0, 64, 384}) {  // DeepSeek-V3's head shape, 3 heads, L across two row tiles plus a remainder
    check<T>("kernel", kernel, 257, 512, 128, 3, o, unsigned(o + 7));
    check<T>("cublas", cublas, 257, 512, 128, 3, o, unsigned(o + 8));
  }
  check<T>("kernel", kernel, 33, 16, 16, 2, 0, 9);  // the window is all of X: K' is the window alone
}

void refusals() {
  bd::cuda::BDProjection<__half> kernel;
  Device<__half> buffer(4096);
  bd::cuda::ProjectionArguments<__half> a{buffer.p, buffer.p, buffer.p, 4, 64, 16, 2, 4};
  bd::cuda::Status s = kernel.run(a);
  expect(!s.ok() && s.message().find("multiples of 8") != std::string::npos, "offset 4 refused: " + s.message());
  a.window_offset = 56;
  s = kernel.run(a);
  expect(!s.ok() && s.message().find("outside") != std::string::npos, "window past the end refused: " + s.message());
  a.window_offset = 0;
  a.x = buffer.p + 1;
  s = kernel.run(a);
  expect(!s.ok() && s.message().find("16-byte aligned") != std::string::npos, "misaligned x refused: " + s.message());
  a.x = buffer.p;
  a.out = nullptr;
  s = bd::cuda::BDProjection<__half>::can_implement(a);
  expect(!s.ok() && s.message().find("null") != std::string::npos, "null out refused: " + s.message());
}

}  // namespace

int main() {
  const int cc = bd::cuda::device_capability();
  if (cc == 0) {
    std::printf("SKIPPED: no CUDA device on this machine; the CUDA tests need one (they compile everywhere)\n");
    return 77;
  }
  std::printf("device compute capability %d.%d\n", cc / 10, cc % 10);
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    std::printf("FAILED: cublasCreate\n");
    return 1;
  }
  if (cc >= 80) {
    suite<__half>(handle);
    suite<__nv_bfloat16>(handle);
  } else {
    std::printf("compute capability below 8.0: only the refusals are tested\n");
  }
  refusals();
  cublasDestroy(handle);
  std::printf(failures ? "%d check(s) FAILED\n" : "all CUDA projection checks passed\n", failures);
  return failures ? 1 : 0;
}
