// bd::compiled — preparation for Eigen::bfloat16 storage: the pipeline on double and on float factors with
// each precision policy of the type, and decompose()'s (core/decompose.hpp lists them).
#include <bd/core/decompose.hpp>

namespace bd::detail {
BD_DECOMPOSE_NARROWER(template, Eigen::bfloat16, Fp32Products)
}  // namespace bd::detail
