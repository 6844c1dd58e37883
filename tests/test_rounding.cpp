// Rounding to the storage types, vectorised (kernel/convert.hpp): every path (portable, AVX2 +
// F16C, AVX-512, each forced in turn) gives the bits of one correct rounding to nearest, ties to
// even — held to a reference written here that shares nothing with bd or Eigen: the input is
// bracketed between two adjacent values of the narrow type (decoded from their bits) and the
// nearer taken, exactly. Inputs cover every exponent (random bit patterns), every tie of both
// types (the midpoint of each adjacent pair, and a double's ulp either side), subnormals, the
// overflow threshold, infinities, NaN and lengths that leave a vector tail.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <bd/kernel/convert.hpp>

#include "support.hpp"

namespace {

template <typename Scalar>
std::uint16_t bits(Scalar x) {
  std::uint16_t b;
  std::memcpy(&b, static_cast<const void*>(&x), sizeof b);
  return b;
}

template <typename Scalar>
bool is_nan_bits(std::uint16_t b) {
  return std::is_same_v<Scalar, Eigen::half> ? (b & 0x7c00u) == 0x7c00u && (b & 0x3ffu) : (b & 0x7f80u) == 0x7f80u && (b & 0x7fu);
}

// The exact value of a half's or a bfloat16's bit pattern (sign clear), decoded by hand. The
// pattern after the largest finite one is infinity's; for rounding it stands at 2^(emax + 1),
// where the next binade would begin (IEEE 754 §4.3.1: overflow exactly as if the exponent range
// were unbounded).
template <typename Scalar>
double decode(std::uint16_t b) {
  if constexpr (std::is_same_v<Scalar, Eigen::half>) {
    const int exponent = (b >> 10) & 0x1f, mantissa = b & 0x3ff;
    if (exponent == 0x1f) return std::ldexp(1.0, 16);
    return exponent == 0 ? std::ldexp(double(mantissa), -24) : std::ldexp(double(mantissa + 1024), exponent - 25);
  } else {
    const int exponent = (b >> 7) & 0xff, mantissa = b & 0x7f;
    if (exponent == 0xff) return std::ldexp(1.0, 128);
    return exponent == 0 ? std::ldexp(double(mantissa), -133) : std::ldexp(double(mantissa + 128), exponent - 134);
  }
}

template <typename Scalar>
constexpr std::uint16_t kInfinity = std::is_same_v<Scalar, Eigen::half> ? 0x7c00 : 0x7f80;

/// Every non-negative value of Scalar up to infinity's stand-in, ascending (the patterns are).
template <typename Scalar>
const std::vector<double>& ladder() {
  static const std::vector<double> values = [] {
    std::vector<double> v;
    for (std::uint32_t b = 0; b <= kInfinity<Scalar>; ++b) v.push_back(decode<Scalar>(std::uint16_t(b)));
    return v;
  }();
  return values;
}

/// The bits of x rounded to nearest, ties to even. x − lo and hi − x are exact in double: lo and
/// hi are adjacent on the ladder with lo ≤ x ≤ hi ≤ 2·lo (Sterbenz), or lo = 0.
template <typename Scalar>
std::uint16_t reference_bits(double x) {
  if (std::isnan(x)) return kInfinity<Scalar> | 1;  // any NaN; compared as NaN
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::abs(x);
  const auto& v = ladder<Scalar>();
  if (a >= v.back()) return sign | kInfinity<Scalar>;
  const auto lo = std::uint16_t(std::upper_bound(v.begin(), v.end(), a) - v.begin() - 1);
  const double below = a - v[lo], above = v[lo + 1] - a;
  const bool up = above < below || (above == below && (lo & 1));
  return sign | std::uint16_t(lo + up);
}

/// The midpoint of every adjacent pair of Scalar's values, and a double's ulp either side: every
/// tie the type has, over its whole exponent range, and the two nearest non-ties.
template <typename Scalar>
std::vector<double> ties() {
  std::vector<double> out;
  const auto& v = ladder<Scalar>();
  for (std::size_t i = 0; i + 1 < v.size(); ++i) {
    const double mid = v[i] + (v[i + 1] - v[i]) / 2;
    for (double t : {mid, std::nextafter(mid, 0.0), std::nextafter(mid, 1e300)}) {
      out.push_back(t);
      out.push_back(-t);
    }
  }
  return out;
}

std::vector<float> float_inputs() {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 6.1035156e-05f,
                          5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f, 1e-45f, std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), 1.0f + std::ldexp(1.0f, -11),
                          1.0f + 3 * std::ldexp(1.0f, -11), 1.0f + std::ldexp(1.0f, -8), 3.3895314e38f};
  std::mt19937 rng(7);
  for (int i = 0; i < 200003; ++i) {
    const std::uint32_t b = rng();
    float f;
    std::memcpy(&f, &b, sizeof f);
    v.push_back(f);
  }
  return v;
}

std::vector<double> double_inputs() {
  std::vector<double> v = {0.0, -0.0, 65504.0, 65519.999999, 65520.0, 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40),
                           1.0 + std::ldexp(1.0, -11) - std::ldexp(1.0, -40), 1e-300, 1e300, -1e39,
                           std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN(),
                           std::ldexp(1.0, -25), std::ldexp(1.0, -25) * (1 + 1e-12)};
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  std::uniform_int_distribution<int> exponent(-160, 140);
  for (int i = 0; i < 200003; ++i) v.push_back((rng() & 1 ? -1 : 1) * std::ldexp(mantissa(rng), exponent(rng)));
  return v;
}

template <typename Scalar, typename In>
void check_round(const std::vector<In>& in) {
  std::vector<Scalar> out(in.size());
  bd::kernel::round_into(in.data(), static_cast<Eigen::Index>(in.size()), out.data());
  std::size_t wrong = 0, first = in.size();
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::uint16_t got = bits(out[i]), expect = reference_bits<Scalar>(double(in[i]));
    const bool same = got == expect || (is_nan_bits<Scalar>(got) && is_nan_bits<Scalar>(expect));
    if (!same && wrong++ == 0) first = i;
  }
  INFO("first mismatch at input " << (first < in.size() ? double(in[first]) : 0.0) << " of " << in.size());
  CHECK(wrong == 0);
}

template <typename Out, typename Scalar>
void check_widen(const std::vector<float>& values) {
  std::vector<Scalar> in(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) in[i] = Scalar(values[i]);
  std::vector<Out> out(in.size());
  bd::kernel::widen_into(in.data(), static_cast<Eigen::Index>(in.size()), out.data());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const Out want = static_cast<Out>(static_cast<float>(in[i]));
    if (!(out[i] == want || (std::isnan(out[i]) && std::isnan(want)))) ++wrong;
  }
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("rounding arrays to half and bfloat16: every path gives one correct rounding", "[kernel][rounding]") {
  const auto floats = float_inputs();
  const auto doubles = double_inputs();
  const auto half_ties = ties<Eigen::half>(), bfloat16_ties = ties<Eigen::bfloat16>();
  bd_test::for_each_isa([&] {
    check_round<Eigen::half>(floats);
    check_round<Eigen::bfloat16>(floats);
    check_round<Eigen::half>(doubles);
    check_round<Eigen::bfloat16>(doubles);
    check_round<Eigen::half>(half_ties);
    check_round<Eigen::bfloat16>(bfloat16_ties);
    check_round<Eigen::half>(bfloat16_ties);  // other types' ties: ordinary values here
    check_round<Eigen::bfloat16>(half_ties);
    check_round<Eigen::half>(std::vector<float>(half_ties.begin(), half_ties.end()));  // float inputs, rounded once
    check_round<Eigen::bfloat16>(std::vector<float>(bfloat16_ties.begin(), bfloat16_ties.end()));
    // Lengths below and around one vector: the tail goes through the scalar code.
    for (std::size_t n : {1u, 7u, 9u, 15u, 17u, 31u}) {
      check_round<Eigen::half>(std::vector<double>(doubles.begin(), doubles.begin() + long(n)));
      check_round<Eigen::bfloat16>(std::vector<float>(floats.begin(), floats.begin() + long(n)));
    }
  });
}

TEST_CASE("widening half and bfloat16 arrays gives their exact values", "[kernel][rounding]") {
  const auto floats = float_inputs();
  bd_test::for_each_isa([&] {
    check_widen<float, Eigen::half>(floats);
    check_widen<double, Eigen::half>(floats);
    check_widen<float, Eigen::bfloat16>(floats);
    check_widen<double, Eigen::bfloat16>(floats);
  });
}
