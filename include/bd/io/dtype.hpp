// bd/io/dtype.hpp — the element types a safetensors file can hold, and how each stored value
// is decoded (F16 and BF16 through kernel::widen_one, FP8 by its definition).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>
#include <type_traits>

#include <Eigen/Core>

#include "bd/kernel/convert.hpp"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#error "bd/io assumes a little-endian host (safetensors data is little-endian)"
#endif

namespace bd::io {

/// F8_E4M3 is OCP FP8 E4M3 "fn" (no infinities; S.1111.111 is NaN; largest 448), the type of
/// DeepSeek-V3's weights; F8_E5M2 is IEEE-like (the top byte of a binary16).
enum class DType { F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U8, BOOL };

inline constexpr DType all_dtypes[] = {DType::F64,     DType::F32, DType::F16, DType::BF16, DType::F8_E4M3, DType::F8_E5M2,
                                       DType::I64,     DType::I32, DType::I16, DType::I8,   DType::U8,      DType::BOOL};

inline std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: case DType::I16: return 2;
    case DType::F8_E4M3: case DType::F8_E5M2: case DType::I8: case DType::U8: case DType::BOOL: return 1;
  }
  return 0;
}

inline bool is_floating_point(DType t) {
  switch (t) {
    case DType::F64: case DType::F32: case DType::F16: case DType::BF16: case DType::F8_E4M3: case DType::F8_E5M2:
      return true;
    default: return false;
  }
}

inline const char* to_string(DType t) {
  switch (t) {
    case DType::F64: return "F64";
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::F8_E5M2: return "F8_E5M2";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::I16: return "I16";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::BOOL: return "BOOL";
  }
  return "?";
}

inline bool parse_dtype(std::string_view s, DType& out) {
  for (DType t : all_dtypes) {
    if (s == to_string(t)) {
      out = t;
      return true;
    }
  }
  return false;
}

/// The dtype that stores C++ type T.
template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, double>) return DType::F64;
  else if constexpr (std::is_same_v<T, float>) return DType::F32;
  else if constexpr (std::is_same_v<T, Eigen::half>) return DType::F16;
  else if constexpr (std::is_same_v<T, Eigen::bfloat16>) return DType::BF16;
  else if constexpr (std::is_same_v<T, std::int64_t>) return DType::I64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return DType::I32;
  else if constexpr (std::is_same_v<T, std::int16_t>) return DType::I16;
  else if constexpr (std::is_same_v<T, std::int8_t>) return DType::I8;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return DType::U8;
  else static_assert(!sizeof(T), "no safetensors dtype for this type");
}

/// OCP FP8 E4M3fn: bias 7, subnormals m·2⁻⁹, S.1111.111 NaN, no infinities. Exact in float.
inline float fp8_e4m3_value(std::uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  float v;
  if (e == 15 && m == 7) v = std::numeric_limits<float>::quiet_NaN();
  else if (e == 0) v = std::ldexp(float(m), -9);
  else v = std::ldexp(float(8 + m), e - 10);  // (1 + m/8)·2^(e−7)
  return (b & 0x80) ? -v : v;
}

/// FP8 E5M2 is the top byte of a binary16.
inline float fp8_e5m2_value(std::uint8_t b) {
  return kernel::widen_one<float>(Eigen::half(Eigen::half_impl::raw_uint16_to_half(static_cast<std::uint16_t>(b << 8))));
}

namespace detail {

template <typename T>
T decode(const unsigned char* p, DType t) {
  auto load = [p](auto tag) {
    decltype(tag) v;
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  switch (t) {
    case DType::F64: return static_cast<T>(load(double{}));
    case DType::F32: return static_cast<T>(load(float{}));
    case DType::F16: return static_cast<T>(kernel::widen_one<float>(Eigen::half(Eigen::half_impl::raw_uint16_to_half(load(std::uint16_t{})))));
    case DType::BF16:
      return static_cast<T>(kernel::widen_one<float>(Eigen::bfloat16(Eigen::bfloat16_impl::raw_uint16_to_bfloat16(load(std::uint16_t{})))));
    case DType::F8_E4M3: return static_cast<T>(fp8_e4m3_value(*p));
    case DType::F8_E5M2: return static_cast<T>(fp8_e5m2_value(*p));
    case DType::I64: return static_cast<T>(load(std::int64_t{}));
    case DType::I32: return static_cast<T>(load(std::int32_t{}));
    case DType::I16: return static_cast<T>(load(std::int16_t{}));
    case DType::I8: return static_cast<T>(load(std::int8_t{}));
    case DType::U8: case DType::BOOL: return static_cast<T>(load(std::uint8_t{}));
  }
  return T{};
}

/// Decodes n stored values into out (the dtype switch outside the loop).
template <typename T>
void decode_into(const unsigned char* p, DType t, std::size_t n, T* out) {
  auto each = [&](auto to_value, std::size_t size) {
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<T>(to_value(p + i * size));
  };
  auto load = [](auto tag) {
    return [](const unsigned char* q) {
      decltype(tag) v;
      std::memcpy(&v, q, sizeof v);
      return v;
    };
  };
  switch (t) {
    case DType::F64: return each(load(double{}), 8);
    case DType::F32: return each(load(float{}), 4);
    case DType::F16:
      return each([](const unsigned char* q) { std::uint16_t b; std::memcpy(&b, q, 2);
                                               return kernel::widen_one<float>(Eigen::half(Eigen::half_impl::raw_uint16_to_half(b))); }, 2);
    case DType::BF16:
      return each([](const unsigned char* q) { std::uint16_t b; std::memcpy(&b, q, 2);
                                               return kernel::widen_one<float>(Eigen::bfloat16(Eigen::bfloat16_impl::raw_uint16_to_bfloat16(b))); }, 2);
    default:
      for (std::size_t i = 0; i < n; ++i) out[i] = decode<T>(p + i * dtype_size(t), t);
  }
}

}  // namespace detail
}  // namespace bd::io
