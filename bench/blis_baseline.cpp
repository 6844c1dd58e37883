#include "blis_baseline.hpp"

#include <blis.h>

namespace bd_bench {

void blis_sgemm(long m, long n, long k, const float* a, long lda, const float* b, long ldb, float* c, long ldc) {
  float one = 1.0f, zero = 0.0f;
  bli_sgemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &one, const_cast<float*>(a), 1, lda, const_cast<float*>(b), 1,
            ldb, &zero, c, 1, ldc);
}

void blis_set_threads(int threads) { bli_thread_set_num_threads(threads); }

const char* blis_configuration() { return bli_arch_string(bli_arch_query_id()); }

}  // namespace bd_bench
