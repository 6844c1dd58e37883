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
