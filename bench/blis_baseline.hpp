// BLIS (Debian: libblis-openmp-dev) as a dense baseline: its object-free typed API, in its own
// translation unit because blis.h and OpenBLAS's cblas.h declare the same CBLAS names.
// Column-major C = A·B (m×k times k×n), float, on `threads` threads.
#pragma once

namespace bd_bench {
void blis_sgemm(long m, long n, long k, const float* a, long lda, const float* b, long ldb, float* c, long ldc);
void blis_set_threads(int threads);
const char* blis_configuration();  // the sub-configuration BLIS chose for this CPU (zen3, skx, ...)
}  // namespace bd_bench
