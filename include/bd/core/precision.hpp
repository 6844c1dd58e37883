// bd/core/precision.hpp — which of preparation's products run in float, as a type.
//
// Preparation is in double, and every stored value keeps its double preparation except where
// float provably costs nothing at the storage type's precision:
//   - the Grams (VᵀV, ΔB·V, ΔB·ΔBᵀ and the exact error's [D̂ Ĉ]ᵀ[D̂ Ĉ]) only enter the refit's
//     correction and the error figure, both already at the scale of the rounding error, where
//     float keeps six digits of them: in float for every storage type narrower than double;
//   - B = U_S·Vᵀ is itself stored: formed in float only for half and bfloat16, whose unit
//     roundoff (2⁻¹¹, 2⁻⁸) is 2¹³ and more times float's, so B rounds to the same stored value
//     but where it lies within float's error of a rounding boundary.
// Options::fp32_products = false keeps everything in double. The policy is chosen once per
// preparation (with_precision) and the fit is compiled for it: each policy's fit holds only
// its own path.
#pragma once

#include <type_traits>

#include "bd/kernel/convert.hpp"

namespace bd::detail {

/// Everything in double: double storage, or Options::fp32_products off.
struct Fp64Products {
  static constexpr bool fp32_grams = false;
  static constexpr bool fp32_basis = false;
};

/// float storage: the Grams in float, B in double.
struct Fp32Grams {
  static constexpr bool fp32_grams = true;
  static constexpr bool fp32_basis = false;
};

/// half and bfloat16 storage: the Grams and B in float (B in blocks along n, coefficient_fit.hpp).
struct Fp32Products {
  static constexpr bool fp32_grams = true;
  static constexpr bool fp32_basis = true;
};

/// Calls f with the policy for storing in Stored: Fp64Products when float is not allowed or
/// Stored is double, else Fp32Products for half and bfloat16 and Fp32Grams for float.
template <typename Stored, typename F>
decltype(auto) with_precision(bool fp32_allowed, F&& f) {
  if constexpr (std::is_same_v<Stored, double>) {
    (void)fp32_allowed;
    return f(Fp64Products{});
  } else if constexpr (bd::kernel::is_narrow_v<Stored>) {
    if (fp32_allowed) return f(Fp32Products{});
    return f(Fp64Products{});
  } else {
    if (fp32_allowed) return f(Fp32Grams{});
    return f(Fp64Products{});
  }
}

}  // namespace bd::detail
