// bd/core/rounding_floor.hpp — the error of simply storing the dense product in Scalar.
//
// This is the yardstick for Options::error_budget: a decomposition stored in Scalar cannot be
// asked to beat the type itself. For narrow types it is measured on a fixed random 64×64 sample
// of entries of W = U·Vᵀ; for double it is the model value u²/3
// (a relative rounding error uniform in [−u, u]), since a product computed in double has no
// more exact reference to compare with.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "bd/base/random.hpp"
#include "bd/core/factored_product.hpp"
#include "bd/core/scalar.hpp"

namespace bd::detail {

template <typename Scalar>
double rounding_floor(const FactoredProduct& p, std::uint64_t seed) {
  const double u = unit_roundoff<Scalar>();
  if constexpr (std::is_same_v<Scalar, double>) {
    return u * u / 3;
  } else {
    // A block W_IJ = U_I·V_Jᵀ of random rows and columns: one small GEMM, no strided dot products.
    Random rng(seed ^ 0x9e3779b97f4a7c15ULL);
    const Index side = 64;
    std::vector<Index> I(static_cast<std::size_t>(std::min(side, p.m()))), J(static_cast<std::size_t>(std::min(side, p.n())));
    for (auto& i : I) i = rng.below(p.m());
    for (auto& j : J) j = rng.below(p.n());
    const Eigen::MatrixXd U_I = p.U(I, Eigen::all), V_J = p.V_rows(J);
    Eigen::MatrixXd block(U_I.rows(), V_J.rows());
    bd::kernel::matmul_into(U_I, V_J.transpose(), block);
    const double err = (rounded_in_double<Scalar>(block) - block).squaredNorm(), energy = block.squaredNorm();
    return energy > 0 ? err / energy : u * u / 3;
  }
}

/// The same, measured on every entry of a dense W.
template <typename Scalar>
double rounding_floor(const Eigen::MatrixXd& W) {
  const double u = unit_roundoff<Scalar>();
  if constexpr (std::is_same_v<Scalar, double>) {
    (void)W;
    return u * u / 3;
  } else {
    const double energy = W.squaredNorm();
    return energy > 0 ? (rounded_in_double<Scalar>(W) - W).squaredNorm() / energy : u * u / 3;
  }
}

}  // namespace bd::detail
