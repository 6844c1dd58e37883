// bd/core/options.hpp — how a decomposition is prepared: which side, which basis, which budget.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <Eigen/Core>

#include "bd/base/error.hpp"
#include "bd/base/index.hpp"
#include "bd/base/names.hpp"

namespace bd {


/// Which form of the identity is built.
///  - Row:    W = P·[I; C]·B, B the r basis rows of W (r×n), C is (m−r)×r.
///  - Col:    W = B·[I, C]·Pᵀ, B the r basis columns of W (m×r), C is r×(n−r).
/// P puts the basis rows (columns) back at indices(), the others in ascending order.
enum class Side { Row, Col };

/// How the r basis rows (columns) are chosen.
enum class Basis {
  First,         ///< the first r: the paper's "First-r"
  Last,          ///< the last r
  ResidualMin,   ///< the better of First and Last (the paper's Residual-min)
  OffsetSearch,  ///< the best contiguous window starting at a multiple of Options::align, or the last one
  Pivoted,       ///< any r, chosen by QR with column pivoting (PIFA-style); per head when shared
  Auto,          ///< the cheapest window meeting Options::error_budget, else Pivoted
  Window,        ///< the window starting at Options::offset (reproduces a recorded choice)
};

/// Preparation settings. Plain aggregate with defaults; the setters return *this for chaining.
struct Options {
  Side side = Side::Row;
  /// Auto: a shared window when it is within error_budget of the type's own rounding, else
  /// per-product pivoting, so the default never trades accuracy silently.
  Basis basis = Basis::Auto;
  /// OffsetSearch: windows start at multiples of align (a kernel keeps loads aligned to it).
  Index align = 16;
  /// Window: first basis index of the window.
  Index offset = 0;
  /// Refit the coefficients against the rounded basis (least squares in double). Free accuracy.
  bool refit = true;
  /// Auto: accept a contiguous window whose NMSE is at most error_budget times the NMSE of
  /// simply rounding the dense product to the storage type.
  double error_budget = 10.0;
  /// Columns of the random sketch used to rank candidate windows.
  Index sketch_columns = 8;
  /// Run the large products in float where that is provably harmless (coefficient_fit.hpp):
  /// the Grams VᵀV, ΔB·V, ΔB·ΔBᵀ for every storage type but double, and B = U_S·Vᵀ for half
  /// and bfloat16. false: every product in double (twice the time, the reference for tests).
  bool fp32_products = true;
  /// Seed of the sketch; fixed so preparation is reproducible.
  std::uint64_t seed = 0x5eed0bd5eed0bdULL;

  Options& with_side(Side s) { side = s; return *this; }
  Options& with_basis(Basis b) { basis = b; return *this; }
  Options& with_align(Index a) { align = a; return *this; }
  Options& with_window(Index o) { basis = Basis::Window; offset = o; return *this; }
  Options& with_refit(bool r) { refit = r; return *this; }
  Options& with_error_budget(double b) { error_budget = b; return *this; }
  Options& with_fp32_products(bool f) { fp32_products = f; return *this; }
};

/// The command-line spelling of each strategy (base/names.hpp).
inline constexpr detail::Named<Basis> basis_names[] = {
    {Basis::First, "first"},     {Basis::Last, "last"}, {Basis::ResidualMin, "residual-min"}, {Basis::OffsetSearch, "offset-search"},
    {Basis::Pivoted, "pivoted"}, {Basis::Auto, "auto"}, {Basis::Window, "window"}};
inline constexpr detail::Named<Side> side_names[] = {{Side::Row, "row"}, {Side::Col, "col"}};

inline const char* to_string(Basis basis) { return detail::name_in(basis_names, basis); }

/// Parses the names printed by to_string (the command-line spelling).
inline Basis parse_basis(std::string_view name) { return detail::parse_in(basis_names, name, "basis strategy"); }

inline const char* to_string(Side side) { return detail::name_in(side_names, side); }
inline Side parse_side(std::string_view name) { return detail::parse_in(side_names, name, "side"); }

}  // namespace bd
