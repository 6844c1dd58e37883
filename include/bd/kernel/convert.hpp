// bd/kernel/convert.hpp — rounding arrays to the storage types and widening them back.
//
// Preparation rounds every basis and coefficient once to the storage type, and reads the
// stored values back to measure the error: about 300 000 values per DeepSeek head, as many
// as a GEMM of depth r writes. Scalar code spends a few nanoseconds on each (a half has no
// native C++ type); F16C/AVX-512 convert 8 or 16 per instruction. The path follows
// active_isa() like the GEMM kernels (cpu.hpp); every path gives the same bits.
//
// One rounding, not two: double → half goes through float rounded to odd (truncate, then set
// the last bit when inexact). A value rounded to odd with at least p + 2 bits and then rounded
// to nearest-even with p bits equals the value rounded once to p bits (Boldo & Melquiond,
// 2008); float has 24 bits, half 11 and bfloat16 8. The naive double → float → half rounds twice.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include <Eigen/Core>

#include "bd/base/index.hpp"
#include "bd/kernel/cpu.hpp"

#ifdef BD_KERNEL_X86
#include <immintrin.h>
#endif

namespace bd::kernel {

using bd::Index;

namespace detail {

inline std::uint32_t bits_of(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}
inline float float_of(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

/// double → float rounded to odd (see the header comment); beyond float's range: ±inf.
inline float round_to_odd_float(double x) {
  float f = static_cast<float>(x);
  const double back = static_cast<double>(f);
  if (back == x || !std::isfinite(f)) return f;  // exact, NaN, or beyond float's range
  std::uint32_t bits = bits_of(f);
  if (std::fabs(back) > std::fabs(x)) bits -= 1;  // rounded away from zero: truncate instead
  return float_of(bits | 1u);                      // inexact: make the last bit odd
}

/// float → IEEE half bits, rounded to nearest even (overflow to ±inf, NaN stays NaN).
inline std::uint16_t half_bits(float f) {
  std::uint32_t x = bits_of(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  std::uint32_t h;
  if (x >= 0x47800000u) {  // |f| ≥ 2^16: beyond half's range whatever the rounding; inf or NaN
    h = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (x < 0x38800000u) {  // |f| < 2^-14: a half subnormal or zero
    // In 0.5 + |f| float's spacing is 2^-24, half's subnormal spacing, so the addition itself
    // rounds to nearest even there; the sum's low bits are the half's (2^-14 carries into 0x400).
    h = bits_of(float_of(x) + 0.5f) - 0x3f000000u;
  } else {  // normal: rebias the exponent by 15 − 127 and round the 13 dropped bits to even
    h = (x + 0xc8000fffu + ((x >> 13) & 1u)) >> 13;
  }
  return static_cast<std::uint16_t>(h | sign);
}

/// float → bfloat16 bits, rounded to nearest even (overflow to ±inf, NaN stays NaN).
inline std::uint16_t bfloat16_bits(float f) {
  const std::uint32_t x = bits_of(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

template <typename Scalar>
Scalar narrow_from_bits(std::uint16_t b) {
  Scalar out;
  std::memcpy(static_cast<void*>(&out), &b, sizeof out);  // Eigen::half / bfloat16 hold their bits
  return out;
}

/// A float rounded once to a narrow Scalar.
template <typename Scalar>
Scalar narrow_from_float(float f) {
  return narrow_from_bits<Scalar>(std::is_same_v<Scalar, Eigen::half> ? half_bits(f) : bfloat16_bits(f));
}

}  // namespace detail

/// The storage-only types: arithmetic on them runs in float.
template <typename Scalar>
inline constexpr bool is_narrow_v = std::is_same_v<Scalar, Eigen::half> || std::is_same_v<Scalar, Eigen::bfloat16>;

/// A double or float rounded once to Scalar, to nearest even: bd's one rounding (a double goes to
/// half or bfloat16 through float rounded to odd, so that it is rounded once, not twice).
template <typename Scalar, typename In>
Scalar round_one(In x) {
  if constexpr (std::is_same_v<Scalar, double> || std::is_same_v<Scalar, float>) {
    return static_cast<Scalar>(x);
  } else if constexpr (std::is_same_v<In, double>) {
    return detail::narrow_from_float<Scalar>(detail::round_to_odd_float(x));
  } else {
    return detail::narrow_from_float<Scalar>(x);
  }
}

namespace detail {
template <typename Scalar, typename In>
void round_portable(const In* in, Index n, Scalar* out) {
  for (Index i = 0; i < n; ++i) out[i] = round_one<Scalar>(in[i]);
}
}  // namespace detail

/// The value of x in Out (exact when Out holds every Scalar value): bd's one widening. bfloat16
/// → float is the upper half of the float's bits, written as an integer shift so that loops over
/// it vectorise (Eigen's conversion does not); half goes through Eigen's (F16C where compiled in).
template <typename Out, typename Scalar>
inline Out widen_one(Scalar x) {
  if constexpr (std::is_same_v<Scalar, Eigen::bfloat16>) return static_cast<Out>(detail::float_of(std::uint32_t(x.value) << 16));
  else if constexpr (std::is_same_v<Scalar, Eigen::half>) return static_cast<Out>(static_cast<float>(x));
  else return static_cast<Out>(x);
}

namespace detail {

template <typename Out, typename Scalar>
void widen_portable(const Scalar* in, Index n, Out* out) {
  for (Index i = 0; i < n; ++i) out[i] = widen_one<Out>(in[i]);
}

#ifdef BD_KERNEL_X86
// AVX2 + F16C, 8 values per step. double → odd float: round to nearest, step back towards zero
// where that went away from zero, set the last bit where inexact (as round_to_odd_float).
// (Lambdas would not inherit the target attribute: helpers are functions.)
BD_TARGET_AVX2 inline __m128i odd_float_bits_avx2(__m256d x) {
  const __m128 f = _mm256_cvtpd_ps(x);
  const __m256d back = _mm256_cvtps_pd(f);
  const __m256d abs = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
  const __m256d inexact = _mm256_cmp_pd(back, x, _CMP_NEQ_UQ);
  const __m256d away = _mm256_cmp_pd(_mm256_and_pd(back, abs), _mm256_and_pd(x, abs), _CMP_GT_OQ);
  // 64-bit lane masks → 32-bit lane masks: the low half of each lane, in order.
  const __m256i low_halves = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  const __m128i inexact32 = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(inexact), low_halves));
  const __m128i away32 = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(away), low_halves));
  __m128i bits = _mm_add_epi32(_mm_castps_si128(f), away32);  // away lanes are −1: one step towards zero
  return _mm_or_si128(bits, _mm_and_si128(inexact32, _mm_set1_epi32(1)));
}

BD_TARGET_AVX2 inline __m256 odd_floats_avx2(const double* in) {
  const __m128i lo = odd_float_bits_avx2(_mm256_loadu_pd(in)), hi = odd_float_bits_avx2(_mm256_loadu_pd(in + 4));
  return _mm256_castsi256_ps(_mm256_set_m128i(hi, lo));
}

BD_TARGET_AVX2 inline __m128i bfloat16_bits_avx2(__m256 f) {
  const __m256i x = _mm256_castps_si256(f);
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1))), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  const __m256i v = _mm256_blendv_epi8(rounded, quiet, nan);
  // 32 → 16 bits: the values fit, so an unsigned pack of the two 128-bit halves keeps them.
  return _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

template <typename Scalar, typename In>
BD_TARGET_AVX2 void round_avx2(const In* in, Index n, Scalar* out) {
  Index i = 0;
  if constexpr (is_narrow_v<Scalar>) {
    for (; i + 8 <= n; i += 8) {
      __m256 f;
      if constexpr (std::is_same_v<In, double>) f = odd_floats_avx2(in + i);
      else f = _mm256_loadu_ps(in + i);
      __m128i h;
      if constexpr (std::is_same_v<Scalar, Eigen::half>) h = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      else h = bfloat16_bits_avx2(f);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
    }
  }
  round_portable(in + i, n - i, out + i);
}

template <typename Out, typename Scalar>
BD_TARGET_AVX2 void widen_avx2(const Scalar* in, Index n, Out* out) {
  Index i = 0;
  if constexpr (is_narrow_v<Scalar>) {
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
      __m256 f;
      if constexpr (std::is_same_v<Scalar, Eigen::half>) f = _mm256_cvtph_ps(h);
      else f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      if constexpr (std::is_same_v<Out, float>) {
        _mm256_storeu_ps(out + i, f);
      } else {
        _mm256_storeu_pd(out + i, _mm256_cvtps_pd(_mm256_castps256_ps128(f)));
        _mm256_storeu_pd(out + i + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
      }
    }
  }
  widen_portable(in + i, n - i, out + i);
}

// AVX-512, 16 values per step; truncation is the conversion's own rounding mode. The zero-masked
// forms compute the same as the plain ones; GCC 12 warns (maybe-uninitialized, PR 105593) on
// the undefined pass-through registers the plain ones inline.
BD_TARGET_AVX512 inline __m256 odd_floats_avx512_half(__m512d x) {
  const __m256 t = _mm512_maskz_cvt_roundpd_ps(0xff, x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __mmask8 inexact = _mm512_cmp_pd_mask(_mm512_maskz_cvtps_pd(0xff, t), x, _CMP_NEQ_UQ);
  const __m256i bits = _mm256_castps_si256(t);
  return _mm256_castsi256_ps(_mm256_mask_or_epi32(bits, inexact, bits, _mm256_set1_epi32(1)));
}

template <typename Scalar, typename In>
BD_TARGET_AVX512 void round_avx512(const In* in, Index n, Scalar* out) {
  Index i = 0;
  if constexpr (is_narrow_v<Scalar> && std::is_same_v<In, double>) {
    for (; i + 8 <= n; i += 8) {
      const __m256 f = odd_floats_avx512_half(_mm512_loadu_pd(in + i));
      __m128i h;
      if constexpr (std::is_same_v<Scalar, Eigen::half>) h = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      else h = bfloat16_bits_avx2(f);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
    }
  } else if constexpr (is_narrow_v<Scalar>) {
    for (; i + 16 <= n; i += 16) {
      const __m512 f = _mm512_loadu_ps(in + i);
      __m256i h;
      if constexpr (std::is_same_v<Scalar, Eigen::half>) {
        h = _mm512_maskz_cvtps_ph(0xffff, f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      } else {
        const __m512i x = _mm512_castps_si512(f);
        const __m512i one = _mm512_set1_epi32(1);
        const __m512i odd = _mm512_and_si512(_mm512_maskz_srli_epi32(0xffff, x, 16), one);
        const __m512i rounded =
            _mm512_maskz_srli_epi32(0xffff, _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), odd), 16);
        const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                                      _mm512_set1_epi32(0x7f800000));
        const __m512i v =
            _mm512_mask_or_epi32(rounded, nan, _mm512_maskz_srli_epi32(0xffff, x, 16), _mm512_set1_epi32(0x40));
        h = _mm512_maskz_cvtepi32_epi16(0xffff, v);
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), h);
    }
  }
  round_portable(in + i, n - i, out + i);
}

template <typename Out, typename Scalar>
BD_TARGET_AVX512 void widen_avx512(const Scalar* in, Index n, Out* out) {
  Index i = 0;
  if constexpr (is_narrow_v<Scalar>) {
    for (; i + 16 <= n; i += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
      __m512 f;
      if constexpr (std::is_same_v<Scalar, Eigen::half>) f = _mm512_maskz_cvtph_ps(0xffff, h);
      else f = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, h), 16));
      if constexpr (std::is_same_v<Out, float>) {
        _mm512_storeu_ps(out + i, f);
      } else {
        _mm512_storeu_pd(out + i, _mm512_maskz_cvtps_pd(0xff, _mm512_maskz_extractf32x8_ps(0xff, f, 0)));
        _mm512_storeu_pd(out + i + 8, _mm512_maskz_cvtps_pd(0xff, _mm512_maskz_extractf32x8_ps(0xff, f, 1)));
      }
    }
  }
  widen_portable(in + i, n - i, out + i);
}
#endif

}  // namespace detail

/// out[i] = in[i] rounded once to Scalar, to nearest even (In: double or float; Scalar: double,
/// float, half or bfloat16). Values beyond Scalar's range become ±inf.
template <typename Scalar, typename In>
void round_into(const In* in, Index n, Scalar* out) {
  static_assert(std::is_same_v<In, double> || std::is_same_v<In, float>, "round_into: double or float input");
#ifdef BD_KERNEL_X86
  const Isa isa = active_isa();
  if (isa == Isa::AVX512) return detail::round_avx512(in, n, out);
  if (isa == Isa::AVX2) return detail::round_avx2(in, n, out);
#endif
  detail::round_portable(in, n, out);
}

/// out[i] = the value of in[i] (exact: Out is float or double, Scalar no wider than Out).
template <typename Out, typename Scalar>
void widen_into(const Scalar* in, Index n, Out* out) {
  static_assert(std::is_same_v<Out, double> || std::is_same_v<Out, float>, "widen_into: double or float output");
  static_assert(sizeof(Scalar) <= sizeof(Out), "widen_into: Out must hold every Scalar value");
#ifdef BD_KERNEL_X86
  const Isa isa = active_isa();
  if (isa == Isa::AVX512) return detail::widen_avx512(in, n, out);
  if (isa == Isa::AVX2) return detail::widen_avx2(in, n, out);
#endif
  detail::widen_portable(in, n, out);
}

}  // namespace bd::kernel
