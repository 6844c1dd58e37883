// bd/kernel/micro_kernel_avx512.hpp — micro-kernels for AVX-512 (F, BW, DQ, VL: Skylake-X and
// later, Zen 4 and later), compiled through target attributes whatever flags the including
// program uses; called only when cpu_has(Isa::AVX512) (dispatch.hpp chooses).
//
// tile: MR rows along two zmm registers (32 floats / 16 doubles) by NR = 12 broadcast columns:
// 24 accumulators + 2 A registers + 1 broadcast of the 32 zmm registers; per k, 2 loads of A,
// 12 broadcasts and 24 FMAs — twice the FMAs per load of the AVX2 tile, which is what lets
// Zen 4 (whose 512-bit FMAs issue as two 256-bit halves) and Intel's two 512-bit FMA ports
// stay busy. Same contract as micro_kernel_avx2.hpp.
//
// GCC 12's avx512fintrin.h implements many intrinsics with `__m512 __Y = __Y;` (an undefined
// vector), which -Wmaybe-uninitialized reports once inlined (GCC PR 105593, fixed in 13); the
// intrinsics used here are the ones that do not: loadu, storeu, set1, fmadd.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "bd/kernel/cpu.hpp"
#include "bd/kernel/micro_kernel_avx2.hpp"
#include "bd/kernel/micro_kernel_portable.hpp"

#ifdef BD_KERNEL_X86
#include <immintrin.h>

namespace bd::kernel {
namespace avx512 {

struct OpsFloat {
  using V = __m512;
  static constexpr Index lanes = 16;
  BD_TARGET_AVX512 static inline BD_ALWAYS_INLINE V load(const float* p) { return _mm512_loadu_ps(p); }
  /// Sixteen bfloat16 values widened exactly (the masked forms: see above).
  BD_TARGET_AVX512 static inline BD_ALWAYS_INLINE V load(const Eigen::bfloat16* p) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, bits), 16));
  }
  BD_TARGET_AVX512 static inline BD_ALWAYS_INLINE void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  BD_TARGET_AVX512 static inline BD_ALWAYS_INLINE V set1(float s) { return _mm512_set1_ps(s); }
  BD_TARGET_AVX512 static inline BD_ALWAYS_INLINE V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  /// Σ of the 16 lanes: halves through memory (the zmm → ymm extract intrinsics are among the
  /// GCC 12 ones above), then the AVX2 reduction.
  BD_TARGET_AVX512 static inline BD_ALWAYS_INLINE V add(V a, V b) { return _mm512_add_ps(a, b); }
  BD_TARGET_AVX512 static inline BD_ALWAYS_INLINE float sum(V v) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, v);
    return avx2::OpsFloat::hsum(_mm256_add_ps(_mm256_load_ps(lanes), _mm256_load_ps(lanes + 8)));
  }
  // The softmax's operations (micro_kernel_simd.inc's softmax_panel). Written with the masked
  // intrinsics and an explicit source, which GCC 12 implements without an undefined vector.
  BD_TARGET_AVX512 static inline BD_ALWAYS_INLINE V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  BD_TARGET_AVX512 static inline BD_ALWAYS_INLINE V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  BD_TARGET_AVX512 static inline BD_ALWAYS_INLINE V max(V a, V b) { return _mm512_mask_max_ps(a, 0xFFFF, a, b); }
  /// e^x as the AVX2 kernel computes it (micro_kernel_avx2.hpp), 2ⁿ applied by vscalefps; 0 below −87.3
  /// (−∞ included), NaN kept.
  BD_TARGET_AVX512 static inline BD_ALWAYS_INLINE V exp(V x) {
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(exp_lowest), _CMP_NLT_UQ);
    x = _mm512_mask_max_ps(x, 0xFFFF, x, _mm512_set1_ps(exp_lowest));
    x = _mm512_mask_min_ps(x, 0xFFFF, x, _mm512_set1_ps(exp_highest));
    const V n = _mm512_mask_roundscale_ps(x, 0xFFFF, _mm512_mul_ps(x, _mm512_set1_ps(exp_log2e)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const V r = _mm512_fnmadd_ps(n, _mm512_set1_ps(exp_ln2_lo), _mm512_fnmadd_ps(n, _mm512_set1_ps(exp_ln2_hi), x));
    V p = _mm512_set1_ps(exp_coefficients[0]);
    for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(exp_coefficients[i]));
    p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(keep, _mm512_mask_scalef_ps(p, 0xFFFF, p, n));
  }
};
struct OpsDouble {
  using V = __m512d;
  static constexpr Index lanes = 8;
  BD_TARGET_AVX512 static inline BD_ALWAYS_INLINE V load(const double* p) { return _mm512_loadu_pd(p); }
  BD_TARGET_AVX512 static inline BD_ALWAYS_INLINE void store(double* p, V v) { _mm512_storeu_pd(p, v); }
  BD_TARGET_AVX512 static inline BD_ALWAYS_INLINE V set1(double s) { return _mm512_set1_pd(s); }
  BD_TARGET_AVX512 static inline BD_ALWAYS_INLINE V fma(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
  BD_TARGET_AVX512 static inline BD_ALWAYS_INLINE V add(V a, V b) { return _mm512_add_pd(a, b); }
  BD_TARGET_AVX512 static inline BD_ALWAYS_INLINE double sum(V v) {
    alignas(64) double lanes[8];
    _mm512_store_pd(lanes, v);
    return avx2::OpsDouble::hsum(_mm256_add_pd(_mm256_load_pd(lanes), _mm256_load_pd(lanes + 4)));
  }
  BD_TARGET_AVX512 static inline BD_ALWAYS_INLINE V sub(V a, V b) { return _mm512_sub_pd(a, b); }
  BD_TARGET_AVX512 static inline BD_ALWAYS_INLINE V mul(V a, V b) { return _mm512_mul_pd(a, b); }
  BD_TARGET_AVX512 static inline BD_ALWAYS_INLINE V max(V a, V b) { return _mm512_mask_max_pd(a, 0xFF, a, b); }
  /// e^x lane by lane with std::exp: double attention is the tests' reference, not a fast path.
  BD_TARGET_AVX512 static inline BD_ALWAYS_INLINE V exp(V x) {
    alignas(64) double lanes[8];
    _mm512_store_pd(lanes, x);
    for (double& v : lanes) v = std::exp(v);
    return _mm512_load_pd(lanes);
  }
};

#define BD_KERNEL_TARGET BD_TARGET_AVX512
#define BD_KERNEL_NAMESPACE avx512
#include "bd/kernel/micro_kernel_simd.inc"
#undef BD_KERNEL_NAMESPACE
#undef BD_KERNEL_TARGET

/// The tile on bf16 pairs (AVX512-BF16): acc(32 × N) = start; acc += A·B over kp pairs of channels;
/// dst = acc. A holds, per pair, 32 rows' 32-bit words (channel 2k in the low half, 2k + 1 in the
/// high), B per pair N words ldb apart (pack.hpp's Packing::Pairs). vdpbf16ps adds to each lane the
/// products of its word's high halves, then of its low halves, each rounded once as an FMA rounds:
/// the tile is tile_columns on twice the channels, half the loads and instructions.
template <int N>
BD_TARGET_AVX512_BF16 inline BD_ALWAYS_INLINE void pair_tile_columns(Index kp, const float* A, const float* B,
                                                                                  Index ldb, const float* const* src,
                                                                                  const float* values, float* const* dst,
                                                                                  Index prefetch) {
  __m512 c0[N], c1[N];
BD_UNROLL(16)
  for (int j = 0; j < N; ++j) {
    if (src) c0[j] = _mm512_loadu_ps(src[j]), c1[j] = _mm512_loadu_ps(src[j] + 16);
    else c0[j] = c1[j] = _mm512_set1_ps(values ? values[j] : 0.0f);
  }
  for (Index k = 0; k < kp; ++k, A += 32, B += ldb) {
    if (prefetch)
BD_UNROLL(2)
      for (Index l = 0; l < 2; ++l) BD_PREFETCH(reinterpret_cast<const char*>(A) + prefetch + 64 * l);
    const __m512bh a0 = (__m512bh)_mm512_loadu_si512(A), a1 = (__m512bh)_mm512_loadu_si512(A + 16);
BD_UNROLL(16)
    for (int j = 0; j < N; ++j) {
      std::uint32_t word;
      std::memcpy(&word, B + j, sizeof word);
      const __m512bh b = (__m512bh)_mm512_set1_epi32(int(word));
      c0[j] = _mm512_dpbf16_ps(c0[j], a0, b), c1[j] = _mm512_dpbf16_ps(c1[j], a1, b);
    }
  }
BD_UNROLL(16)
  for (int j = 0; j < N; ++j) _mm512_storeu_ps(dst[j], c0[j]), _mm512_storeu_ps(dst[j] + 16, c1[j]);
}

template <int N>
BD_TARGET_AVX512_BF16 inline void pair_tile(Index columns, Index kp, const float* A, const float* B, Index ldb,
                                            const float* const* src, const float* values, float* const* dst, Index prefetch) {
  if constexpr (N > 1) {
    if (columns < N) return pair_tile<N - 1>(columns, kp, A, B, ldb, src, values, dst, prefetch);
  }
  pair_tile_columns<N>(kp, A, B, ldb, src, values, dst, prefetch);
}

/// bf16 pairs of two vectors (vcvtne2ps2bf16, to nearest even: pack.hpp's bf16_upper, but for
/// subnormals, which it flushes as vdpbf16ps does): word i = lo[i] in its low half, hi[i] in its high.
BD_TARGET_AVX512_BF16 inline BD_ALWAYS_INLINE __m512i pair_words(__m512 lo, __m512 hi) {
  alignas(64) static constexpr std::int16_t interleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                               8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);  // lo's 16 values, then hi's
  return _mm512_permutexvar_epi16(_mm512_load_si512(interleave), halves);
}

/// Two channels' runs of n keys as bf16 pairs in panels of nr ≤ 16 keys:
/// to[(j / nr)·panel_stride + j % nr] = (lo[j], hi[j]) for j < n, zero to the last panel's end
/// (hi null: a zero high half).
BD_TARGET_AVX512_BF16 inline void pair_channels(const float* lo, const float* hi, Index n, Index nr, float* to,
                                                Index panel_stride) {
  const __mmask16 panel = __mmask16((1u << nr) - 1);
  for (Index j0 = 0; j0 < n; j0 += nr, to += panel_stride) {
    const __mmask16 m = n - j0 >= nr ? panel : __mmask16((1u << (n - j0)) - 1);
    const __m512 l = _mm512_maskz_loadu_ps(m, lo + j0), h = hi ? _mm512_maskz_loadu_ps(m, hi + j0) : _mm512_setzero_ps();
    _mm512_mask_storeu_epi32(to, panel, pair_words(l, h));
  }
}

/// The bfloat16 values at p (lanes in m) zero-extended into 32-bit lanes.
BD_TARGET_AVX512_BF16 inline BD_ALWAYS_INLINE __m512i halfwords(__mmask16 m, const Eigen::bfloat16* p) {
  return _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_maskz_loadu_epi16(m, p));
}

/// The same from runs stored in bfloat16: each pair is lo's halfword under hi's, nothing rounded.
BD_TARGET_AVX512_BF16 inline void pair_channels(const Eigen::bfloat16* lo, const Eigen::bfloat16* hi, Index n, Index nr,
                                                float* to, Index panel_stride) {
  const __mmask16 panel = __mmask16((1u << nr) - 1);
  for (Index j0 = 0; j0 < n; j0 += nr, to += panel_stride) {
    const __mmask16 m = n - j0 >= nr ? panel : __mmask16((1u << (n - j0)) - 1);
    const __m512i l = halfwords(m, lo + j0);
    const __m512i words = hi ? _mm512_or_si512(l, _mm512_maskz_slli_epi32(0xFFFF, halfwords(m, hi + j0), 16)) : l;
    _mm512_mask_storeu_epi32(to, panel, words);
  }
}

/// One channel's run of n keys as bf16 pairs of consecutive keys: word u = (run[2u], run[2u + 1]),
/// an odd n's last with a zero high half. In key order vcvtne2ps2bf16's halves are already pairs.
BD_TARGET_AVX512_BF16 inline void pair_keys(const float* run, Index n, float* to) {
  Index k = 0;
  for (; k + 32 <= n; k += 32, to += 16)
    _mm512_storeu_si512(to, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(run + k + 16), _mm512_loadu_ps(run + k)));
  if (k == n) return;
  const Index rest = n - k;
  const __mmask16 first = __mmask16(rest >= 16 ? 0xffffu : (1u << rest) - 1);
  const __mmask16 second = __mmask16(rest > 16 ? (1u << (rest - 16)) - 1 : 0u);
  const __m512 a = _mm512_maskz_loadu_ps(first, run + k), b = _mm512_maskz_loadu_ps(second, run + k + 16);
  const __mmask16 words = __mmask16((1u << ((rest + 1) / 2)) - 1);
  _mm512_mask_storeu_epi32(to, words, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

/// A k-major float panel of kn steps of `lanes` (a multiple of 16) as bf16 pairs, in place:
/// step t becomes pair t's words (as pack.hpp's round_panel does for FMAs; steps 2t and 2t + 1 are read
/// before step t is written).
BD_TARGET_AVX512_BF16 inline void pair_panel(float* panel, Index lanes, Index kn) {
  for (Index t = 0; 2 * t < kn; ++t) {
    const float* even = panel + 2 * t * lanes;
    const float* odd = 2 * t + 1 < kn ? even + lanes : nullptr;
    for (Index i = 0; i < lanes; i += 16)
      _mm512_storeu_si512(panel + t * lanes + i,
                          pair_words(_mm512_loadu_ps(even + i), odd ? _mm512_loadu_ps(odd + i) : _mm512_setzero_ps()));
  }
}

/// Sixteen floats' bits rounded to bfloat16 in the upper half of each lane: pack.hpp's
/// bf16_upper (nearest even, a NaN quieted) on a vector (the masked shift: see above).
BD_TARGET_AVX512 inline BD_ALWAYS_INLINE __m512i bf16_upper(__m512i x) {
  const __m512i upper = _mm512_set1_epi32(int(0xffff0000u));
  const __m512i lsb = _mm512_and_si512(_mm512_maskz_srli_epi32(0xFFFF, x, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_and_si512(_mm512_add_epi32(x, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), upper);
  const __m512i quiet = _mm512_and_si512(_mm512_or_si512(x, _mm512_set1_epi32(0x00400000)), upper);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_blend_epi32(nan, rounded, quiet);
}

/// avx2::round_channels for panels of nr ≤ 16 keys.
BD_TARGET_AVX512 inline void round_channels(const float* lo, const float* hi, Index n, Index nr, float* to,
                                            Index panel_stride) {
  const __mmask16 panel = __mmask16((1u << nr) - 1);
  for (Index j0 = 0; j0 < n; j0 += nr, to += panel_stride) {
    const __mmask16 m = n - j0 >= nr ? panel : __mmask16((1u << (n - j0)) - 1);
    const __m512i l = _mm512_maskz_loadu_epi32(m, lo + j0);
    const __m512i h = hi ? bf16_upper(_mm512_maskz_loadu_epi32(m, hi + j0)) : _mm512_setzero_si512();
    _mm512_mask_storeu_epi32(to, panel, h);
    _mm512_mask_storeu_epi32(to + nr, panel, bf16_upper(l));
  }
}

/// round_panel on a panel whose `lanes` are a multiple of 16, in place.
BD_TARGET_AVX512 inline void round_rows(float* panel, Index lanes, Index kn) {
  for (Index t = 0; t < kn / 2; ++t)
    for (Index i = 2 * t * lanes; i < (2 * t + 1) * lanes; i += 16) {
      const __m512i even = _mm512_loadu_si512(panel + i), odd = _mm512_loadu_si512(panel + i + lanes);
      _mm512_storeu_si512(panel + i, bf16_upper(odd));
      _mm512_storeu_si512(panel + i + lanes, bf16_upper(even));
    }
  if (kn % 2 == 0) return;
  for (Index i = (kn - 1) * lanes; i < kn * lanes; i += 16) {
    _mm512_storeu_si512(panel + i + lanes, bf16_upper(_mm512_loadu_si512(panel + i)));
    _mm512_storeu_si512(panel + i, _mm512_setzero_si512());
  }
}

}  // namespace avx512

/// float: 32 × 12; double: 16 × 12 (micro_kernel_simd.inc's Routines), and for float the tile on
/// bf16 pairs.
template <typename T>
using Avx512Ops = std::conditional_t<std::is_same_v<T, float>, avx512::OpsFloat, avx512::OpsDouble>;

template <typename T>
struct Avx512Kernel : avx512::Routines<Avx512Ops<T>, T, 2 * Avx512Ops<T>::lanes, 12> {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "AVX-512 kernels exist for float and double");
  static constexpr bool any_width = true;
  /// tile on bf16 pairs (kc: pairs of channels; Packing::Pairs), float only; run only where the
  /// context says the CPU has vdpbf16ps (Context::bf16_dot).
  static constexpr bool pair_tiles = std::is_same_v<T, float>;
  static void tile_pairs(Index columns, Index kc, const T* A, const T* B, Index ldb, const T* const* src, const T* values,
                         T* const* dst, Index prefetch) {
    if constexpr (pair_tiles) avx512::pair_tile<Avx512Kernel::nr>(columns, kc, A, B, ldb, src, values, dst, prefetch);
  }
  /// Packing into bf16 pairs for those tiles (float only, AVX512-BF16 too): two channels' runs
  /// (float, or bfloat16 as they lie) into key panels, one channel's run into pairs of keys, a
  /// panel in place.
  static void pair_channels(const T* lo, const T* hi, Index n, Index nr, T* to, Index panel_stride) {
    if constexpr (pair_tiles) avx512::pair_channels(lo, hi, n, nr, to, panel_stride);
  }
  static void pair_channels(const Eigen::bfloat16* lo, const Eigen::bfloat16* hi, Index n, Index nr, T* to, Index panel_stride) {
    if constexpr (pair_tiles) avx512::pair_channels(lo, hi, n, nr, to, panel_stride);
  }
  static void pair_keys(const T* run, Index n, T* to) {
    if constexpr (pair_tiles) avx512::pair_keys(run, n, to);
  }
  static void pair_panel(T* panel, Index lanes, Index kn) {
    if constexpr (pair_tiles) avx512::pair_panel(panel, lanes, kn);
  }
  /// Packing::Rounded's rounding in vector registers (float only; pack.hpp's round_panel's bits).
  static constexpr bool rounds_panels = std::is_same_v<T, float>;
  static void round_channels(const T* lo, const T* hi, Index n, Index nr, T* to, Index panel_stride) {
    if constexpr (rounds_panels) avx512::round_channels(lo, hi, n, nr, to, panel_stride);
  }
  static void round_rows(T* panel, Index lanes, Index kn) {
    if constexpr (rounds_panels) avx512::round_rows(panel, lanes, kn);
  }
  /// Preparation's small factorizations run the AVX2 bodies (the same layouts: rows padded to 16
  /// values for any ISA): AVX-512 bodies would cost every program their code and compile time
  /// for a part of scoring, itself under a third of a preparation (docs/architecture.md,
  /// "Compile time").
  static void lu_rows(T* a, Index n, Index ld, Index* perm) { Avx2Kernel<T>::lu_rows(a, n, ld, perm); }
  static void lower_inverse_rows(const T* L, Index rs, Index cs, Index n, bool unit, T* work, Index ld, T* out, Index ldo) {
    Avx2Kernel<T>::lower_inverse_rows(L, rs, cs, n, unit, work, ld, out, ldo);
  }
  static void qr_pivots(T* a, Index rows, Index ld, Index cols, Index count, Index* perm, T* diag, T* scratch) {
    Avx2Kernel<T>::qr_pivots(a, rows, ld, cols, count, perm, diag, scratch);
  }
};

}  // namespace bd::kernel
#endif
