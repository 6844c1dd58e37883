// bd::compiled — preparation for float storage: the pipeline on double and on float factors
// (both precisions of its products), and decompose()'s (core/decompose.hpp lists them).
#include <bd/core/decompose.hpp>

namespace bd::detail {
BD_DECOMPOSE_STORED(template, float)
}  // namespace bd::detail
