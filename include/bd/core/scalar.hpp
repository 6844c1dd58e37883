// bd/core/scalar.hpp — the storage types bd supports and how a double is rounded to them once.
//
// Preparation happens in double; the result is rounded to the storage type exactly once.
// Narrow types (Eigen::half, Eigen::bfloat16) are storage only: arithmetic on them accumulates
// in float (acc_t).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include <Eigen/Core>

namespace bd {

template <typename Scalar>
struct scalar_traits;

template <>
struct scalar_traits<double> {
  using acc_t = double;
  static constexpr const char* name = "f64";
  static constexpr int mantissa_bits = 53;  // with the implicit bit
};
template <>
struct scalar_traits<float> {
  using acc_t = float;
  static constexpr const char* name = "f32";
  static constexpr int mantissa_bits = 24;
};
template <>
struct scalar_traits<Eigen::half> {
  using acc_t = float;
  static constexpr const char* name = "f16";
  static constexpr int mantissa_bits = 11;
};
template <>
struct scalar_traits<Eigen::bfloat16> {
  using acc_t = float;
  static constexpr const char* name = "bf16";
  static constexpr int mantissa_bits = 8;
};

template <typename Scalar>
inline constexpr bool is_supported_scalar_v =
    std::is_same_v<Scalar, double> || std::is_same_v<Scalar, float> ||
    std::is_same_v<Scalar, Eigen::half> || std::is_same_v<Scalar, Eigen::bfloat16>;

/// The type arithmetic on Scalar accumulates in.
template <typename Scalar>
using acc_t = typename scalar_traits<Scalar>::acc_t;

/// Machine epsilon of Scalar (distance from 1 to the next representable number): 2^(1−p).
template <typename Scalar>
constexpr double epsilon() {
  return 1.0 / static_cast<double>(std::uint64_t{1} << (scalar_traits<Scalar>::mantissa_bits - 1));
}

/// Unit roundoff u = ε/2: |round(x) − x| ≤ u·|x| for round-to-nearest in the normal range.
template <typename Scalar>
constexpr double unit_roundoff() {
  return epsilon<Scalar>() / 2;
}

/// Largest finite value of Scalar.
template <typename Scalar>
double max_finite() {
  return static_cast<double>(static_cast<acc_t<Scalar>>(Eigen::NumTraits<Scalar>::highest()));
}

namespace detail {

/// double → float rounding to odd: truncate towards zero and set the last bit when inexact.
/// A value rounded to odd with at least p+2 bits, then rounded to nearest-even with p bits,
/// equals the value rounded once to p bits (Boldo & Melquiond). float has 24 bits, half 11 and
/// bfloat16 8, so double → odd float → half/bfloat16 is a single correct rounding, where the
/// naive double → float → half would round twice.
inline float round_to_odd_float(double x) {
  float f = static_cast<float>(x);
  const double back = static_cast<double>(f);
  if (back == x || !std::isfinite(f)) return f;  // exact, NaN, or beyond float's range
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if (std::fabs(back) > std::fabs(x)) bits -= 1;  // rounded away from zero: truncate instead
  bits |= 1u;                                      // inexact: make the last bit odd
  std::memcpy(&f, &bits, sizeof bits);
  return f;
}

}  // namespace detail

/// Rounds a double to Scalar once, to nearest-even.
template <typename Scalar>
Scalar round_to(double x) {
  static_assert(is_supported_scalar_v<Scalar>, "bd supports double, float, Eigen::half and Eigen::bfloat16");
  if constexpr (std::is_same_v<Scalar, double>) {
    return x;
  } else if constexpr (std::is_same_v<Scalar, float>) {
    return static_cast<float>(x);
  } else {
    return Scalar(detail::round_to_odd_float(x));
  }
}

/// Value of a Scalar as a double (exact for every supported type).
template <typename Scalar>
double to_double(Scalar x) {
  return static_cast<double>(static_cast<acc_t<Scalar>>(x));
}

/// Rounds a double matrix to Scalar once, element by element.
template <typename Scalar, typename Derived>
Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic> round_matrix(const Eigen::MatrixBase<Derived>& m) {
  return m.derived().unaryExpr([](double x) { return round_to<Scalar>(x); });
}

/// The values a double matrix takes once rounded to Scalar, kept in double.
template <typename Scalar, typename Derived>
Eigen::MatrixXd rounded_in_double(const Eigen::MatrixBase<Derived>& m) {
  return m.derived().unaryExpr([](double x) { return to_double(round_to<Scalar>(x)); });
}

}  // namespace bd
