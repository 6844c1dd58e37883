// bd/kernel/micro_kernel_avx2.hpp — micro-kernels for AVX2 + FMA (Haswell, Zen 1 and later),
// compiled through target attributes whatever flags the including program uses; called only
// when cpu_has(Isa::AVX2) (dispatch.hpp chooses).
//
// tile: an MR × NR block of the output in registers, MR rows along the SIMD lanes (two ymm
// registers), NR = 6 columns broadcast from the packed B panel: 12 accumulators + 2 A registers
// + 1 broadcast = 15 of the 16 ymm registers; per k, 2 loads of A, 6 broadcasts, 12 FMAs.
// The accumulators start from the caller's start columns (BD's basis channels, a bias, or 0),
// so the output is written once. `columns` < NR computes only the first `columns` columns.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "bd/kernel/cpu.hpp"
#include "bd/kernel/micro_kernel_portable.hpp"

#ifdef BD_KERNEL_X86
#include <immintrin.h>

namespace bd::kernel {

// e^x in float for the softmax: x = n·ln2 + r with |r| ≤ ln2/2 (ln2 split in a part exact in
// float and a correction, Cody–Waite), e^r by Cephes' polynomial (1 + r + r²·p(r), about
// 1 ulp on that interval), times 2ⁿ. Shared by the AVX2 and AVX-512 kernels.
inline constexpr float exp_lowest = -87.3365447f;  ///< below: 0 (2ⁿ would leave the normal range)
inline constexpr float exp_highest = 88.0f;        ///< above: clamped (softmax arguments are ≤ 0)
inline constexpr float exp_log2e = 1.44269504088896341f;
inline constexpr float exp_ln2_hi = 0.693359375f;
inline constexpr float exp_ln2_lo = -2.12194440e-4f;

/// Cephes' expf coefficients, highest degree first: e^r ≈ 1 + r + r²·p(r).
inline constexpr float exp_coefficients[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                              4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

namespace avx2 {

struct OpsFloat {
  using V = __m256;
  static constexpr Index lanes = 8;
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE V load(const float* p) { return _mm256_loadu_ps(p); }
  /// Eight bfloat16 values widened exactly: each one's 16 bits become the upper half of a float.
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE V load(const Eigen::bfloat16* p) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
  }
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE V set1(float s) { return _mm256_set1_ps(s); }
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE V add(V a, V b) { return _mm256_add_ps(a, b); }
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE float sum(V v) { return hsum(v); }
  /// Σ of the 8 lanes in three dependent adds (a scalar loop would chain seven).
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE float hsum(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps(x, x, 1)));
  }
  // The softmax's operations (micro_kernel_simd.inc's softmax_panel).
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE V max(V a, V b) { return _mm256_max_ps(a, b); }
  /// e^x: n = round(x·log₂e), r = x − n·ln2 in two parts, e^r by the polynomial, 2ⁿ built in the
  /// exponent bits; 0 below −87.3 (−∞ included: a masked score), NaN kept.
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE V exp(V x) {
    const V keep = _mm256_cmp_ps(x, _mm256_set1_ps(exp_lowest), _CMP_NLT_UQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(exp_lowest)), _mm256_set1_ps(exp_highest));
    const V n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(exp_log2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const V r = _mm256_fnmadd_ps(n, _mm256_set1_ps(exp_ln2_lo), _mm256_fnmadd_ps(n, _mm256_set1_ps(exp_ln2_hi), x));
    V p = _mm256_set1_ps(exp_coefficients[0]);
    for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(exp_coefficients[i]));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(keep, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
  }
};
struct OpsDouble {
  using V = __m256d;
  static constexpr Index lanes = 4;
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE V load(const double* p) { return _mm256_loadu_pd(p); }
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE void store(double* p, V v) { _mm256_storeu_pd(p, v); }
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE V set1(double s) { return _mm256_set1_pd(s); }
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE V add(V a, V b) { return _mm256_add_pd(a, b); }
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE double sum(V v) { return hsum(v); }
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE double hsum(__m256d v) {
    const __m128d x = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(x, _mm_unpackhi_pd(x, x)));
  }
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE V sub(V a, V b) { return _mm256_sub_pd(a, b); }
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE V mul(V a, V b) { return _mm256_mul_pd(a, b); }
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE V max(V a, V b) { return _mm256_max_pd(a, b); }
  /// e^x lane by lane with std::exp: double attention is the tests' reference, not a fast path.
  BD_TARGET_AVX2 static inline BD_ALWAYS_INLINE V exp(V x) {
    alignas(32) double lanes[4];
    _mm256_store_pd(lanes, x);
    for (double& v : lanes) v = std::exp(v);
    return _mm256_load_pd(lanes);
  }
};

#define BD_KERNEL_TARGET BD_TARGET_AVX2
#define BD_KERNEL_NAMESPACE avx2
#include "bd/kernel/micro_kernel_simd.inc"
#undef BD_KERNEL_NAMESPACE
#undef BD_KERNEL_TARGET

/// Eight floats' bits rounded to bfloat16 in the upper half of each lane: pack.hpp's bf16_upper
/// (nearest even, a NaN quieted) on a vector.
BD_TARGET_AVX2 inline BD_ALWAYS_INLINE __m256i bf16_upper(__m256i x) {
  const __m256i upper = _mm256_set1_epi32(int(0xffff0000u));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_and_si256(_mm256_add_epi32(x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), upper);
  const __m256i quiet = _mm256_and_si256(_mm256_or_si256(x, _mm256_set1_epi32(0x00400000)), upper);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

/// Lanes [0, count) set, for maskload and maskstore.
BD_TARGET_AVX2 inline BD_ALWAYS_INLINE __m256i first_lanes(Index count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/// Two channels' runs of n keys rounded to bfloat16 into Packing::Rounded's panels of nr ≤ 8
/// keys, a pair's two steps swapped as pack.hpp's round_panel lays them out: step 0 of the pair
/// holds hi's values (zeros where hi is null: an odd depth's last channel), step 1 lo's;
/// to[(j / nr)·panel_stride + j % nr] and the same + nr, zero to the last panel's end.
BD_TARGET_AVX2 inline void round_channels(const float* lo, const float* hi, Index n, Index nr, float* to,
                                          Index panel_stride) {
  const __m256i panel = first_lanes(nr);
  for (Index j0 = 0; j0 < n; j0 += nr, to += panel_stride) {
    const __m256i m = first_lanes(std::min(nr, n - j0));
    const __m256i l = _mm256_maskload_epi32(reinterpret_cast<const int*>(lo + j0), m);
    const __m256i h = hi ? bf16_upper(_mm256_maskload_epi32(reinterpret_cast<const int*>(hi + j0), m)) : _mm256_setzero_si256();
    _mm256_maskstore_epi32(reinterpret_cast<int*>(to), panel, h);
    _mm256_maskstore_epi32(reinterpret_cast<int*>(to + nr), panel, bf16_upper(l));
  }
}

/// round_panel on a panel whose `lanes` are a multiple of 8, in place.
BD_TARGET_AVX2 inline void round_rows(float* panel, Index lanes, Index kn) {
  const auto at = [panel](Index i) { return reinterpret_cast<__m256i*>(panel + i); };
  for (Index t = 0; t < kn / 2; ++t)
    for (Index i = 2 * t * lanes; i < (2 * t + 1) * lanes; i += 8) {
      const __m256i even = _mm256_loadu_si256(at(i)), odd = _mm256_loadu_si256(at(i + lanes));
      _mm256_storeu_si256(at(i), bf16_upper(odd));
      _mm256_storeu_si256(at(i + lanes), bf16_upper(even));
    }
  if (kn % 2 == 0) return;
  for (Index i = (kn - 1) * lanes; i < kn * lanes; i += 8) {
    _mm256_storeu_si256(at(i + lanes), bf16_upper(_mm256_loadu_si256(at(i))));
    _mm256_storeu_si256(at(i), _mm256_setzero_si256());
  }
}

}  // namespace avx2

/// float: 16 × 6; double: 8 × 6 (micro_kernel_simd.inc's Routines; tile() computes any
/// number of columns up to nr).
template <typename T>
using Avx2Ops = std::conditional_t<std::is_same_v<T, float>, avx2::OpsFloat, avx2::OpsDouble>;

template <typename T>
struct Avx2Kernel : avx2::Routines<Avx2Ops<T>, T, 2 * Avx2Ops<T>::lanes, 6> {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "AVX2 kernels exist for float and double");
  static constexpr bool any_width = true;
  /// Packing::Rounded's rounding in vector registers (float only; pack.hpp's round_panel's bits).
  static constexpr bool rounds_panels = std::is_same_v<T, float>;
  static void round_channels(const T* lo, const T* hi, Index n, Index nr, T* to, Index panel_stride) {
    if constexpr (rounds_panels) avx2::round_channels(lo, hi, n, nr, to, panel_stride);
  }
  static void round_rows(T* panel, Index lanes, Index kn) {
    if constexpr (rounds_panels) avx2::round_rows(panel, lanes, kn);
  }
};

}  // namespace bd::kernel
#endif
