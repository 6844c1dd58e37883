// bd::compiled — the kernel's instantiations: the GEMM, flash attention, the small and large
// products, the triangular inverse, the small LU and the Cholesky factor, for every scalar type
// bd's layers and preparation use, each with its AVX-512, AVX2 and portable micro-kernels.
// Headers declare them extern where BD_COMPILED_LIB is defined (docs/architecture.md).
#include <bd/kernel/cholesky.hpp>
#include <bd/kernel/flash_attention.hpp>
#include <bd/kernel/gemm.hpp>
#include <bd/kernel/inverse.hpp>
#include <bd/kernel/matmul.hpp>
#include <bd/kernel/small_lu.hpp>

namespace bd::kernel {
BD_GEMM_INSTANTIATIONS(template)
BD_FLASH_ATTENTION_INSTANTIATIONS(template)
BD_MATMUL_INSTANTIATIONS(template)
BD_INVERSE_INSTANTIATIONS(template)
BD_SMALL_LU_INSTANTIATIONS(template)
BD_CHOLESKY_INSTANTIATIONS(template)
}  // namespace bd::kernel
