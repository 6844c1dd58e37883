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
#include <string>
#include <type_traits>

#include <Eigen/Core>

#include "bd/base/error.hpp"
#include "bd/kernel/convert.hpp"

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

/// A storage type chosen at run time (a command's --dtype, a checkpoint's record): one of the four
/// scalar types above. `dispatch` turns it back into a type.
enum class Storage {
  F64, F32, F16, BF16,
};

inline constexpr Storage all_storages[] = {Storage::F64, Storage::F32, Storage::F16, Storage::BF16};

template <typename Scalar>
constexpr Storage storage_of() {
  static_assert(is_supported_scalar_v<Scalar>, "bd supports double, float, Eigen::half and Eigen::bfloat16");
  if constexpr (std::is_same_v<Scalar, double>) return Storage::F64;
  else if constexpr (std::is_same_v<Scalar, float>) return Storage::F32;
  else if constexpr (std::is_same_v<Scalar, Eigen::half>) return Storage::F16;
  else return Storage::BF16;
}

/// Each storage type's name, the scalar's own (scalar_traits<S>::name).
inline constexpr detail::Named<Storage> storage_names[] = {{Storage::F64, scalar_traits<double>::name},
                                                           {Storage::F32, scalar_traits<float>::name},
                                                           {Storage::F16, scalar_traits<Eigen::half>::name},
                                                           {Storage::BF16, scalar_traits<Eigen::bfloat16>::name}};

inline const char* to_string(Storage s) { return detail::name_in(storage_names, s); }

/// "f64", "f32", "f16" or "bf16"; anything else throws RangeError naming the four.
inline Storage parse_storage(const std::string& name) { return detail::parse_in(storage_names, name, "storage type"); }

/// A type as a value, for generic lambdas: `dispatch(s, [&](auto t) { using S = typename decltype(t)::type; … })`.
template <typename T>
struct type_tag {
  using type = T;
};

/// Calls f(type_tag<S>{}) with the scalar type S that `s` names; returns what f returns.
template <typename F>
decltype(auto) dispatch(Storage s, F&& f) {
  switch (s) {
    case Storage::F64: return f(type_tag<double>{});
    case Storage::F32: return f(type_tag<float>{});
    case Storage::F16: return f(type_tag<Eigen::half>{});
    case Storage::BF16: break;
  }
  return f(type_tag<Eigen::bfloat16>{});
}

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

/// Rounds a double to Scalar once, to nearest-even (for half and bfloat16 through float
/// rounded to odd: one rounding, not two; see kernel/convert.hpp).
template <typename Scalar>
Scalar round_to(double x) {
  static_assert(is_supported_scalar_v<Scalar>, "bd supports double, float, Eigen::half and Eigen::bfloat16");
  return kernel::round_one<Scalar>(x);
}

/// Rounds a float to Scalar once (exact for float and double).
template <typename Scalar>
Scalar round_to(float x) {
  static_assert(is_supported_scalar_v<Scalar>, "bd supports double, float, Eigen::half and Eigen::bfloat16");
  return kernel::round_one<Scalar>(x);
}

/// Value of a Scalar as a double (exact for every supported type).
template <typename Scalar>
double to_double(Scalar x) {
  return static_cast<double>(static_cast<acc_t<Scalar>>(x));
}

/// Rounds a double (or float) matrix to Scalar once, element by element (kernel/convert.hpp:
/// vectorised for the CPU the program runs on).
template <typename Scalar, typename Derived>
Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic> round_matrix(const Eigen::MatrixBase<Derived>& m) {
  using In = typename Derived::Scalar;
  static_assert(std::is_same_v<In, double> || std::is_same_v<In, float>, "round_matrix: double or float input");
  using InMatrix = Eigen::Matrix<In, Eigen::Dynamic, Eigen::Dynamic>;
  const Eigen::Ref<const InMatrix> in(m.derived());  // a plain, contiguous matrix: no copy
  Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic> out(m.rows(), m.cols());
  if (in.outerStride() == in.rows()) {
    kernel::round_into(in.data(), in.size(), out.data());
  } else {
    for (Eigen::Index j = 0; j < in.cols(); ++j) kernel::round_into(in.col(j).data(), in.rows(), out.col(j).data());
  }
  return out;
}

/// The values of a Scalar matrix in Out (float or double; exact, Out at least as wide).
template <typename Out, typename Scalar>
Eigen::Matrix<Out, Eigen::Dynamic, Eigen::Dynamic> values_as(const Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic>& m) {
  Eigen::Matrix<Out, Eigen::Dynamic, Eigen::Dynamic> out(m.rows(), m.cols());
  kernel::widen_into(m.data(), m.size(), out.data());
  return out;
}

/// The values a double matrix takes once rounded to Scalar, kept in double.
template <typename Scalar, typename Derived>
Eigen::MatrixXd rounded_in_double(const Eigen::MatrixBase<Derived>& m) {
  return values_as<double>(round_matrix<Scalar>(m.template cast<double>()));
}

}  // namespace bd
