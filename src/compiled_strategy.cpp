// bd::compiled — the strategies (first, last, residual-min, offset search, pivoted, auto) for
// every stored type, each taking its fit as a FitFunction (core/strategy.hpp), and decompose()'s
// factoring of a dense W (a rank-revealing QR and the singular values), which no stored type changes.
#include <bd/core/decompose.hpp>
#include <bd/core/strategy.hpp>

namespace bd::detail {
BD_RUN_STRATEGY_INSTANTIATIONS(template)
BD_FACTOR_DENSE_INSTANTIATION(template)
}  // namespace bd::detail
