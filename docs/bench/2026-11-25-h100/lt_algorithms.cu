// Exploration, not part of bd and not built by CMake (kept as the record behind a README figure):
// every algorithm cuBLASLt's heuristics offer for the gathered BD key projection (batched over
// heads, window as stride-0 C, no row blocks; also g heads per batch against a replicated window)
// and for the dense GEMM, each timed with events. lt_algorithms.log: L = 1024, 16384, 65536, one
// head per batch; lt_algorithms_groups.log: this version (L = 1024, 4096, 16384).
// nvcc -O2 -std=c++17 -arch=sm_90a lt_algorithms.cu -o lt_algorithms -lcublasLt
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cstdio>
#include <vector>
#include <algorithm>
#define CK(x) do { auto e = (x); if ((int)e != 0) { std::printf("%s:%d error %d\n", __FILE__, __LINE__, (int)e); return 1; } } while (0)
__global__ void fill(half* p, long long n, unsigned seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    unsigned h = (unsigned(i) * 2654435761u) ^ seed; h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    p[i] = __float2half_rn((float(h % 2001u) / 1000.0f - 1.0f) * 0.05f);
  }
}
static cublasLtMatrixLayout_t lay(uint64_t r, uint64_t c, int64_t ld, int batch, int64_t stride) {
  cublasLtMatrixLayout_t l; cublasLtMatrixLayoutCreate(&l, CUDA_R_16F, r, c, ld);
  cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch);
  cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
  return l;
}
int main() {
  const int n = 128, d = 512, dh = 128, N = n * dh, K = d - dh;
  cublasLtHandle_t h; CK(cublasLtCreate(&h));
  size_t ws_bytes = 64 << 20; void* ws; CK(cudaMalloc(&ws, ws_bytes));
  for (int L : {1024, 4096, 16384}) {
    half *x, *rest, *c, *w, *out;
    CK(cudaMalloc(&x, size_t(L) * d * 2)); CK(cudaMalloc(&rest, size_t(L) * K * 2)); CK(cudaMalloc(&c, size_t(K) * N * 2));
    CK(cudaMalloc(&w, size_t(d) * N * 2)); CK(cudaMalloc(&out, size_t(L) * N * 2));
    fill<<<1024, 256>>>(x, (long long)L * d, 1); fill<<<1024, 256>>>(rest, (long long)L * K, 2); fill<<<1024, 256>>>(c, (long long)K * N, 3); fill<<<1024, 256>>>(w, (long long)d * N, 4); cudaDeviceSynchronize();
    cublasLtMatmulDesc_t op; CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasLtMatmulPreference_t pref; cublasLtMatmulPreferenceCreate(&pref);
    uint64_t wb = ws_bytes; cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wb, sizeof wb);
    float one = 1, zero = 0;
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    auto bench = [&](const char* name, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
                     const void* pa, const void* pb, const void* pc, void* pd, const float* beta) -> double {
      cublasLtMatmulHeuristicResult_t res[64]; int got = 0;
      cublasLtMatmulAlgoGetHeuristic(h, op, A, B, C, D, pref, 64, res, &got);
      double best = 1e30; int best_i = -1; double first = -1;
      for (int i = 0; i < got; ++i) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
        bool ok = true;
        for (int r = 0; r < 3 && ok; ++r) ok = cublasLtMatmul(h, op, &one, pa, A, pb, B, beta, pc, C, pd, D, &res[i].algo, ws, ws_bytes, 0) == 0;
        if (!ok) continue;
        const int reps = L >= 16384 ? 10 : 50;
        cudaEventRecord(e0);
        for (int r = 0; r < reps; ++r) cublasLtMatmul(h, op, &one, pa, A, pb, B, beta, pc, C, pd, D, &res[i].algo, ws, ws_bytes, 0);
        cudaEventRecord(e1); cudaEventSynchronize(e1);
        float ms; cudaEventElapsedTime(&ms, e0, e1);
        const double us = ms * 1e3 / reps;
        if (i == 0) first = us;
        if (us < best) best = us, best_i = i;
      }
      std::printf("L=%d %s: %d algorithms; heuristic's first %.1f us, best %.1f us (#%d)\n", L, name, got, first, best, best_i);
      return best;
    };
    // Dense: Dᵀ (N × L) = Wᵀ (N × d) · Xᵀ (d × L)
    const double dense = bench("dense", lay(N, d, N, 1, 0), lay(d, L, d, 1, 0), lay(N, L, N, 1, 0), lay(N, L, N, 1, 0), w, x, out, out, &zero);
    // BD with g heads per batch: the window replicated g times into an L × g·d_h buffer (C input,
    // batch stride 0), so each batch is m = g·d_h rows of Dᵀ.
    for (int g : {1, 2, 4, 8, 16}) {
      half* rep; CK(cudaMalloc(&rep, size_t(L) * g * dh * 2));
      fill<<<1024, 256>>>(rep, (long long)L * g * dh, 5); cudaDeviceSynchronize();
      char name[64]; std::snprintf(name, sizeof name, "bd g=%d heads per batch", g);
      const double t = bench(name, lay(g * dh, K, N, n / g, g * dh), lay(K, L, K, n / g, 0), lay(g * dh, L, g * dh, n / g, 0),
                             lay(g * dh, L, N, n / g, g * dh), c, rest, rep, out, &one);
      std::printf("L=%d g=%d: best dense / best BD = %.3f\n", L, g, dense / t);
      cudaFree(rep);
    }
    // BD gathered: per head Dᵀ_h (dh × L) = C_hᵀ (dh × K) · restᵀ (K × L) + windowᵀ (dh × L, ld d, stride 0)
    const double bd = bench("bd gathered", lay(dh, K, N, n, dh), lay(K, L, K, n, 0), lay(dh, L, d, n, 0), lay(dh, L, N, n, dh), c, rest, x + 256, out, &one);
    std::printf("L=%d best dense / best BD = %.3f\n", L, dense / bd);
    cudaFree(x); cudaFree(rest); cudaFree(c); cudaFree(w); cudaFree(out);
  }
  return 0;
}
