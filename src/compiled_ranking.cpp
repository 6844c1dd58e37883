// bd::compiled — preparation's stages that depend on no stored type: a product factored for
// ranking, the windows' scores, the strategies' choices, the fits' helpers.
#include <bd/core/basis_selection.hpp>
#include <bd/core/coefficient_fit.hpp>
#include <bd/core/factored_product.hpp>
#include <bd/core/strategy.hpp>

namespace bd::ranking {
BD_FACTORED_PRODUCT_INSTANTIATIONS(template)
BD_BASIS_SELECTION_INSTANTIATIONS(template)
BD_SCREEN_INSTANTIATIONS(template)
}  // namespace bd::ranking

namespace bd::detail {
BD_STRATEGY_INSTANTIATIONS(template)
BD_COEFFICIENT_FIT_INSTANTIATIONS(template)
}  // namespace bd::detail
