// bd/core/precision.hpp — which of preparation's products run in float.
//
// Preparation is in double, and every stored value keeps its double preparation except where
// float provably costs nothing at the storage type's precision:
//   - the Grams (VᵀV, ΔB·V, ΔB·ΔBᵀ and the exact error's [D̂ Ĉ]ᵀ[D̂ Ĉ]) only enter the refit's
//     correction and the error figure, both already at the scale of the rounding error, where
//     float keeps six digits of them: in float for every storage type narrower than double;
//   - B = U_S·Vᵀ is itself stored: formed in float only for half and bfloat16, whose unit
//     roundoff (2⁻¹¹, 2⁻⁸) is 2¹³ and more times float's, so B rounds to the same stored value
//     but where it lies within float's error of a rounding boundary.
// Options::fp32_products = false keeps everything in double. The choice is made once per
// preparation (precision_for) and read by the fit's stages as two flags: one instantiation of the
// pipeline per stored type serves both, its float paths compiled only where the stored type can
// take them (the README's example: 9 KB less code than with the fit compiled once per path).
#pragma once

#include <type_traits>

#include "bd/kernel/convert.hpp"

namespace bd::detail {

/// Which of preparation's products run in float.
struct Precision {
  bool fp32_grams = false;  ///< the Grams (ΔB·V, ΔB·ΔBᵀ, the exact error's) in float
  bool fp32_basis = false;  ///< B = U_S·Vᵀ formed in float, in blocks (half and bfloat16)
};

/// Whether storing in Stored can put the Grams in float (every type narrower than double), and
/// B too (half and bfloat16): the float paths are compiled only for such types.
template <typename Stored>
inline constexpr bool fp32_grams_possible = !std::is_same_v<Stored, double>;
template <typename Stored>
inline constexpr bool fp32_basis_possible = bd::kernel::is_narrow_v<Stored>;

/// Whether a stage storing in Stored runs the Grams / B in float: constant false where Stored
/// cannot take them, so that their paths fold away there.
template <typename Stored>
bool grams_in_float(Precision p) { return fp32_grams_possible<Stored> && p.fp32_grams; }
template <typename Stored>
bool basis_in_float(Precision p) { return fp32_basis_possible<Stored> && p.fp32_basis; }

/// The precision for storing in Stored: everything in double when float is not allowed or Stored
/// is double; else the Grams in float, and B in float for half and bfloat16.
template <typename Stored>
Precision precision_for(bool fp32_allowed) {
  return {fp32_allowed && fp32_grams_possible<Stored>, fp32_allowed && fp32_basis_possible<Stored>};
}

}  // namespace bd::detail
