// bd::compiled — preparation for double storage: the pipeline on double and on float factors
// and decompose()'s (core/decompose.hpp lists them); and the
// truncated SVD that turns a dense layer into a low-rank one (core/truncated_svd.hpp).
#include <bd/core/decompose.hpp>
#include <bd/core/truncated_svd.hpp>

namespace bd::detail {
BD_DECOMPOSE_STORED(template, double)
}  // namespace bd::detail

namespace bd {
BD_TRUNCATED_SVD_INSTANTIATIONS(template)
}  // namespace bd
