// The BD projection on a GPU equals the CPU reference
//     K'[l, h·d_h + j] = X[l, o + j] + Σ_k X[l, rest(k)]·C[k, h·d_h + j]
// for every window position (multiples of 8), odd L, L not a multiple of the 128-row tile,
// n·d_h not a multiple of the 128-column tile, three or more k-tiles at small d, half and
// bfloat16, through the tensor-core kernel, cuBLAS and cuBLASLt, on a non-default stream. K' sits
// between guard bands and starts filled with a NaN sentinel: an unwritten output or a write past
// either end fails. And run() refuses what it cannot do, with the reason, does not report a
// caller's pending error as its own, and gives a borrowed cuBLAS handle its stream and math mode back.
// On an H100/H200 the same holds for the sm_90a kernel (HopperBDProjection) with a cluster of 1
// and of 2 and as plan() chooses, for every window that is a multiple of 64, d_h = 64, 128, 256,
// heads that do not fill a 256-column tile, and enough rows that every CTA loops over several
// tiles; run() after plan() with new X and K' buffers, and its refusals.
// Without a CUDA device it prints why and exits 77, which ctest reports as skipped.
//   --has-device  exit 0 if a CUDA device is present, 77 if not (the sanitizer tests ask first)
//   --sanitizer   leave out the one check that plants a launch error on purpose (compute-sanitizer
//                 reports every failed API call, that one too)
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <bd/cuda/cublaslt_projection.cuh>
#include <bd/cuda/hopper_projection.cuh>
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

constexpr std::size_t kGuard = 64;  // elements of guard band on each side of K'

/// Runs `impl` on L × d input and checks K' against the CPU reference, its guard bands, and that
/// every output was written.
/// How a path rounds K' (the bound below follows it).
enum class Rounding {
  once,         ///< the fused kernel, cuBLASLt with the rest gathered: K' rounded once
  in_place,     ///< cuBLAS: the window broadcast, then every piece a GEMM with C = D
  first_apart,  ///< cuBLASLt in place: the first piece with the window as a separate C, the second with C = D
};

/// The Hopper kernel planned with a given configuration ({0, 0}: chosen by timing).
template <typename T>
struct HopperPlanned {
  using Arguments = bd::cuda::ProjectionArguments<T>;
  bd::cuda::HopperBDProjection<T>& impl;
  bd::cuda::HopperConfig config;
  bd::cuda::Status plan(const Arguments& a) { return impl.plan(a, config); }
  bd::cuda::Status run(const Arguments& a, cudaStream_t stream) const { return impl.run(a, stream); }
};

template <typename Impl, typename = void>
struct needs_plan : std::false_type {};
template <typename Impl>
struct needs_plan<Impl, std::void_t<decltype(std::declval<Impl&>().plan(std::declval<const typename Impl::Arguments&>()))>>
    : std::true_type {};

template <typename T, typename Impl>
void check(const char* name, Impl& impl, cudaStream_t stream, int L, int d, int dh, int n, int o, unsigned seed, Rounding rounding) {
  const int N = n * dh, K = d - dh;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<T> x(std::size_t(L) * d), c(std::size_t(K) * N), out(std::size_t(L) * N + 2 * kGuard);
  for (auto& v : x) v = from_float<T>(normal(rng));
  for (auto& v : c) v = from_float<T>(normal(rng) / std::sqrt(float(K)));
  Device<T> dx(x.size()), dc(c.size()), dout(out.size());
  cudaMemcpy(dx.p, x.data(), x.size() * sizeof(T), cudaMemcpyHostToDevice);
  cudaMemcpy(dc.p, c.data(), c.size() * sizeof(T), cudaMemcpyHostToDevice);
  cudaMemset(dout.p, 0xFF, out.size() * sizeof(T));  // 0xFFFF: a NaN in half and in bfloat16
  bd::cuda::ProjectionArguments<T> a{dx.p, dc.p, dout.p + kGuard, L, d, dh, n, o};
  bd::cuda::Status s = bd::cuda::Status::success();
  if constexpr (needs_plan<Impl>::value) s = impl.plan(a);
  if (s) s = impl.run(a, stream);
  const bd::cuda::Status synced = bd::cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const std::string where = std::string(name) + " " + bd::cuda::DataType<T>::name + " L=" + std::to_string(L) + " d=" +
                            std::to_string(d) + " d_h=" + std::to_string(dh) + " n=" + std::to_string(n) + " o=" + std::to_string(o);
  expect(s.ok() && synced.ok(), where + ": " + s.message() + synced.message());
  if (!s.ok() || !synced.ok()) return;
  cudaMemcpy(out.data(), dout.p, out.size() * sizeof(T), cudaMemcpyDeviceToHost);
  std::size_t guards_touched = 0;
  for (std::size_t g = 0; g < kGuard; ++g) {
    guards_touched += reinterpret_cast<const std::uint16_t&>(out[g]) != 0xFFFF;
    guards_touched += reinterpret_cast<const std::uint16_t&>(out[out.size() - 1 - g]) != 0xFFFF;
  }
  expect(guards_touched == 0, where + ": " + std::to_string(guards_touched) + " guard elements written");
  // Bound: one rounding to T of the result (u_T·|ref|) plus fp32 accumulation over K + 1 terms
  // ((K + 1)·2^-24·Σ|terms|, doubled for the order cuBLAS or the kernel chooses). A GEMM that
  // accumulates into its own output (C = D) was seen on an H100 (CUDA 13.0, cuBLAS and cuBLASLt
  // alike, split-K reductions held to fp32) to miss that bound by up to 260×, as if it rounded its
  // product A·B to T before adding C: such a call is allowed u_T·(|its piece's product| + |its
  // result|). A NaN (the sentinel of an unwritten output) fails explicitly: it would slip
  // through a max().
  const bool two_pieces = o > 0 && o < K;
  double worst = 0;
  std::size_t not_finite = 0;
  int shown = 0;
  for (int l = 0; l < L; ++l)
    for (int col = 0; col < N; ++col) {
      const double window = to_float(x[std::size_t(l) * d + o + col % dh]);
      double left = 0, right = 0, mag = std::fabs(window);
      for (int k = 0; k < K; ++k) {
        const int ch = k < o ? k : k + dh;
        const double term = double(to_float(x[std::size_t(l) * d + ch])) * to_float(c[std::size_t(k) * N + col]);
        (k < o ? left : right) += term;
        mag += std::fabs(term);
      }
      const double partial = window + left, ref = partial + right;
      const double got = to_float(out[kGuard + std::size_t(l) * N + col]);
      if (!std::isfinite(got)) {
        if (++shown <= 3) std::printf("  %s: K'[%d, %d] not written or not finite\n", name, l, col);
        ++not_finite;
        continue;
      }
      double rounded = std::fabs(ref);  // Σ of the magnitudes rounded to T along the path
      if (rounding == Rounding::in_place) {
        if (o > 0) rounded += std::fabs(left) + (o < K ? std::fabs(partial) : 0.0);
        if (o < K) rounded += std::fabs(right);
      } else if (rounding == Rounding::first_apart && two_pieces) {
        rounded += std::fabs(partial) + std::fabs(right);
      }
      const double bound = unit_roundoff<T>() * rounded + 2.0 * (K + 1) * std::ldexp(1.0, -24) * mag + 1e-30;
      if (std::fabs(got - ref) > bound && ++shown <= 3)  // where it goes wrong says which index map is wrong
        std::printf("  %s: K'[%d, %d] = %.6g, expected %.6g\n", name, l, col, got, ref);
      worst = std::max(worst, std::fabs(got - ref) / bound);
    }
  expect(not_finite == 0, where + ": " + std::to_string(not_finite) + " outputs unwritten or not finite");
  expect(worst <= 1.0, where + ": error " + std::to_string(worst) + " × the bound");
  if (L * N >= 100000) std::printf("%s: worst error %.3f × the bound\n", where.c_str(), worst);
}

template <typename T>
void suite(cublasHandle_t handle, cublasLtHandle_t lt_handle, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  bd::cuda::BDProjection<T> kernel;
  bd::cuda::CublasBDProjection<T> cublas(handle);
  bd::cuda::CublasLtBDProjection<T> cublaslt(lt_handle, workspace, workspace_bytes);
  bd::cuda::CublasLtBDProjection<T> cublaslt_pieces(lt_handle, workspace, workspace_bytes, bd::cuda::Pieces::InPlace);
  const auto all = [&](int L, int d, int dh, int n, int o, unsigned seed) {
    check<T>("kernel", kernel, stream, L, d, dh, n, o, seed, Rounding::once);
    check<T>("cublas", cublas, stream, L, d, dh, n, o, seed + 1, Rounding::in_place);
    check<T>("cublaslt", cublaslt, stream, L, d, dh, n, o, seed + 2, Rounding::once);
    check<T>("cublaslt (in place)", cublaslt_pieces, stream, L, d, dh, n, o, seed + 3, Rounding::first_apart);
  };
  for (int o = 0; o + 16 <= 64; o += 8)  // every window position of a 64-wide input, d_h = 16
    for (int L : {1, 7, 130}) all(L, 64, 16, 9, o, unsigned(L * 100 + o));  // n·d_h = 144: a partial column tile
  for (int o = 0; o + 8 <= 112; o += 8) all(7, 112, 8, 3, o, unsigned(5000 + o));  // K = 104: four k-tiles, the last partial
  for (int o : {0, 40, 88}) all(131, 104, 16, 9, o, unsigned(6000 + o));
  for (int o : {0, 64, 256, 384}) all(257, 512, 128, 3, o, unsigned(o + 7));  // DeepSeek-V3's head shape, 3 heads
  all(33, 16, 16, 2, 0, 9);  // the window is all of X: K' is the window alone
  // More rows than cuBLASLt's blocks of 16384: a full block and a tail, both pieces of rest.
  check<T>("cublaslt", cublaslt, stream, 16384 + 130, 64, 16, 9, 24, 11, Rounding::once);
  check<T>("cublaslt (in place)", cublaslt_pieces, stream, 16384 + 130, 64, 16, 9, 24, 12, Rounding::first_apart);
  // What the heuristics said for a middle window at DeepSeek's shape (plan() reads no memory:
  // stand-in pointers, aligned and apart, as the argument check wants them).
  const auto at = [](std::uintptr_t address) { return reinterpret_cast<T*>(address); };
  const bd::cuda::Status planned = cublaslt.plan({at(0x1000), at(0x100000), at(0x200000), 1, 512, 128, 3, 256});
  expect(planned.ok(), "cuBLASLt plan at d = 512, o = 256: " + planned.message());
  std::printf("cuBLASLt (%s, middle window): %s\n", bd::cuda::DataType<T>::name, cublaslt.plan_summary().c_str());
  const bd::cuda::Status planned_pieces = cublaslt_pieces.plan({at(0x1000), at(0x100000), at(0x200000), 1, 512, 128, 3, 256});
  expect(planned_pieces.ok(), "cuBLASLt plan at d = 512, o = 256, in place: " + planned_pieces.message());
  std::printf("cuBLASLt (%s, middle window, in place): %s\n", bd::cuda::DataType<T>::name, cublaslt_pieces.plan_summary().c_str());
}

/// The sm_90a kernel, where the device and the binary have it.
template <typename T>
void hopper_suite(cudaStream_t stream, bool sanitizer) {
  bd::cuda::HopperBDProjection<T> impl;
  const auto at = [](std::uintptr_t address) { return reinterpret_cast<T*>(address); };
  const bd::cuda::Status here = impl.can_implement({at(0x1000), at(0x100000), at(0x200000), 1, 512, 128, 3, 256});
  if (!here) {
    std::printf("HopperBDProjection not tested here: %s\n", here.message().c_str());
    return;
  }
  // Every cluster size, stage count and store; under a sanitizer (slow) four configurations that
  // still cover each.
  constexpr int staged = int(bd::cuda::hopper::Store::staged), direct = int(bd::cuda::hopper::Store::direct);
  std::vector<bd::cuda::HopperConfig> configs = {{1, 3, staged}, {2, 4, staged}, {4, 3, direct}, {1, 4, direct}};
  if (!sanitizer)
    for (int store : {staged, direct})
      for (int stages : {3, 4})
        for (int cluster : {1, 2, 4}) configs.push_back({cluster, stages, store});
  if (!sanitizer) configs.erase(configs.begin(), configs.begin() + 4);
  for (const bd::cuda::HopperConfig& config : configs) {
      const int cluster = config.cluster, stages = config.stages;
      HopperPlanned<T> h{impl, config};
      const std::string name = "hopper (cluster " + std::to_string(cluster) + ", " + std::to_string(stages) + " stages, " +
                               (config.store == direct ? "direct" : "staged") + " stores)";
      const unsigned seed = unsigned(10 * stages + cluster + 100 * config.store);
      for (int o = 0; o <= 384; o += 64) check<T>(name.c_str(), h, stream, 257, 512, 128, 3, o, seed + unsigned(o), Rounding::once);
      for (int o : {0, 128, 256}) check<T>(name.c_str(), h, stream, 130, 320, 64, 5, o, seed + 100 + unsigned(o), Rounding::once);
      for (int o : {0, 64, 128}) check<T>(name.c_str(), h, stream, 129, 384, 256, 2, o, seed + 200 + unsigned(o), Rounding::once);
      check<T>(name.c_str(), h, stream, 1, 128, 64, 1, 64, seed + 300, Rounding::once);    // one row, one head, the window last
      check<T>(name.c_str(), h, stream, 64, 256, 128, 256, 0, seed + 301, Rounding::once);  // 128 column tiles: CTAs loop
      // 130 row tiles × 2 column tiles: every CTA takes two or more tiles in turn.
      if (!sanitizer && cluster != 2) check<T>(name.c_str(), h, stream, 16384 + 130, 256, 128, 4, 128, seed + 302, Rounding::once);
    }
  HopperPlanned<T> timed{impl, {0, 0, 0}};  // both stores among the candidates
  check<T>("hopper (configuration chosen by timing)", timed, stream, 1000, 512, 128, 8, 384, 400, Rounding::once);
  std::printf("HopperBDProjection (%s): %s\n", bd::cuda::DataType<T>::name, impl.plan_summary().c_str());

  // run() after plan() with other X and K' buffers (the tensor maps re-encoded), and the refusals.
  const int L = 200, d = 512, dh = 128, n = 2, N = n * dh, K = d - dh;
  Device<T> x1(std::size_t(L) * d), x2(std::size_t(L) * d), coeff(std::size_t(K) * N), out1(std::size_t(L) * N), out2(std::size_t(L) * N);
  std::vector<T> host(std::size_t(L) * d);
  std::mt19937 rng(17);
  std::normal_distribution<float> normal;
  for (auto& v : host) v = from_float<T>(normal(rng));
  cudaMemcpy(x1.p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  for (auto& v : host) v = from_float<T>(normal(rng));
  cudaMemcpy(x2.p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  std::vector<T> hc(std::size_t(K) * N);
  for (auto& v : hc) v = from_float<T>(normal(rng) * 0.05f);
  cudaMemcpy(coeff.p, hc.data(), hc.size() * sizeof(T), cudaMemcpyHostToDevice);
  bd::cuda::ProjectionArguments<T> a{x1.p, coeff.p, out1.p, L, d, dh, n, 256};
  bd::cuda::Status s = impl.plan(a, {1, 3, staged});
  bd::cuda::ProjectionArguments<T> b = a;
  b.x = x2.p, b.out = out2.p;
  if (s) s = impl.run(b, stream);  // first the other buffers …
  if (s) s = impl.run(a, stream);  // … then plan()'s again
  if (s) s = bd::cuda::check(cudaStreamSynchronize(stream), "sync");
  expect(s.ok(), "hopper: run() with other X and K' after plan(): " + s.message());
  bd::cuda::HopperBDProjection<T> other;
  Device<T> out3(std::size_t(L) * N);
  bd::cuda::ProjectionArguments<T> c = b;
  c.out = out3.p;
  s = other.plan(c, {2, 4, direct});  // the other store: the same bits
  if (s) s = other.run(c, stream);
  if (s) s = bd::cuda::check(cudaStreamSynchronize(stream), "sync");
  std::vector<T> r2(std::size_t(L) * N), r3(r2.size());
  cudaMemcpy(r2.data(), out2.p, r2.size() * sizeof(T), cudaMemcpyDeviceToHost);
  cudaMemcpy(r3.data(), out3.p, r3.size() * sizeof(T), cudaMemcpyDeviceToHost);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < r2.size(); ++i) differ += reinterpret_cast<const std::uint16_t&>(r2[i]) != reinterpret_cast<const std::uint16_t&>(r3[i]);
  expect(s.ok() && differ == 0, "hopper: K' from new buffers after plan() equals a fresh plan's with direct stores, bit for bit (" +
                                    std::to_string(differ) + " differ) " + s.message());
  bd::cuda::ProjectionArguments<T> wrong = a;
  wrong.coeff = x2.p;  // a valid buffer of C's size, apart from the others: only "not plan()'s" is wrong
  s = impl.run(wrong, stream);
  expect(!s.ok() && s.message().find("plan() again") != std::string::npos, "hopper: other coefficients refused: " + s.message());
  wrong = a;
  wrong.rows = L - 1;
  s = impl.run(wrong, stream);
  expect(!s.ok() && s.message().find("plan() was not given") != std::string::npos, "hopper: an unplanned shape refused: " + s.message());
  wrong = a;
  wrong.window_offset = 200;
  s = impl.plan(wrong);
  expect(!s.ok() && s.message().find("multiples of 64") != std::string::npos, "hopper: a window off the 64 grid refused: " + s.message());
  s = impl.plan(a, {1, 3, 3});
  expect(!s.ok() && s.message().find("store = 3") != std::string::npos, "hopper: an unknown store refused: " + s.message());
}

__global__ void nothing() {}

void refusals(cublasHandle_t handle, bool plant_errors) {
  bd::cuda::BDProjection<__half> kernel;
  Device<__half> buffer(8192);
  bd::cuda::ProjectionArguments<__half> a{buffer.p, buffer.p + 4096, buffer.p + 6144, 4, 64, 16, 2, 4};
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
  a.out = buffer.p + 128;
  s = kernel.run(a);
  expect(!s.ok() && s.message().find("overlaps") != std::string::npos, "out overlapping x refused: " + s.message());
  a.out = buffer.p + 6144;

  // A caller's pending error (an invalid launch configuration, which is not sticky) is not
  // reported as the run's own, and is left for the caller to read.
  // Which code the runtime gives a block of 4096 threads differs between CUDA versions (CUDA 13
  // on an H100: cudaErrorInvalidValue), so the test reads it back rather than naming it.
  bd::cuda::CublasBDProjection<__half> cublas(handle);
  if (plant_errors) {
    nothing<<<1, 4096>>>();
    const cudaError_t planted = cudaPeekAtLastError();
    expect(planted != cudaSuccess, "a block of 4096 threads is refused at launch");
    s = cublas.run(a);
    expect(!s.ok() && s.message().find("pending") != std::string::npos, "a pending error is named as earlier: " + s.message());
    const cudaError_t still = cudaGetLastError();
    expect(still == planted, std::string("the caller's error is still there to read: planted ") + cudaGetErrorName(planted) +
                                 ", read back " + cudaGetErrorName(still));
  }
  s = cublas.run(a);
  expect(s.ok() && cudaDeviceSynchronize() == cudaSuccess, "once cleared, run() launches: " + s.message());

  // The borrowed handle's stream is the caller's again after run().
  cudaStream_t mine = nullptr, other = nullptr;
  cudaStreamCreate(&mine);
  cudaStreamCreate(&other);
  cublasSetStream(handle, mine);
  cublasSetMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH);
  s = cublas.run(a, other);
  cudaStream_t after = nullptr;
  cublasMath_t mode_after = CUBLAS_DEFAULT_MATH;
  cublasGetStream(handle, &after);
  cublasGetMathMode(handle, &mode_after);
  expect(s.ok() && after == mine && mode_after == CUBLAS_TF32_TENSOR_OP_MATH, "CublasBDProjection restores the handle's stream and math mode");
  bd::cuda::CublasDense<__half> dense(handle);
  s = dense.run(buffer.p, buffer.p + 4096, buffer.p + 6144, 4, 64, 32, other);
  cublasGetStream(handle, &after);
  cublasGetMathMode(handle, &mode_after);
  expect(s.ok() && after == mine && mode_after == CUBLAS_TF32_TENSOR_OP_MATH, "CublasDense restores the handle's stream and math mode");
  cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH);
  cudaDeviceSynchronize();
  cublasSetStream(handle, nullptr);
  cudaStreamDestroy(mine);
  cudaStreamDestroy(other);
}

}  // namespace

int main(int argc, char** argv) {
  bool has_device_only = false, plant_errors = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--has-device") has_device_only = true;
    else if (arg == "--sanitizer") plant_errors = false;
    else {
      std::printf("unknown argument %s (expected --has-device or --sanitizer)\n", argv[i]);
      return 2;
    }
  }
  const int cc = bd::cuda::device_capability();
  if (has_device_only) return cc == 0 ? 77 : 0;
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
  cublasLtHandle_t lt_handle;
  cublasLtCreate(&lt_handle);
  const std::size_t workspace_bytes = std::size_t(32) << 20;
  Device<unsigned char> workspace(workspace_bytes);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);  // not the default stream
  if (cc >= 80) {
    suite<__half>(handle, lt_handle, workspace.p, workspace_bytes, stream);
    suite<__nv_bfloat16>(handle, lt_handle, workspace.p, workspace_bytes, stream);
    hopper_suite<__half>(stream, !plant_errors);
    hopper_suite<__nv_bfloat16>(stream, !plant_errors);
  } else {
    std::printf("compute capability below 8.0: only the refusals are tested\n");
  }
  cudaStreamDestroy(stream);
  cublasLtDestroy(lt_handle);
  refusals(handle, plant_errors);
  cublasDestroy(handle);
  std::printf(failures ? "%d check(s) FAILED\n" : "all CUDA projection checks passed\n", failures);
  return failures ? 1 : 0;
}
