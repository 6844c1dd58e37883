// bd/kernel/micro_kernel_avx512.hpp — micro-kernels for AVX-512 (F, BW, DQ, VL: Skylake-X and
// later, Zen 4 and later), compiled through target attributes whatever flags the including
// program uses; called only when cpu_has(Isa::avx512) (gemm.hpp dispatches).
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

#include <type_traits>

#include "bd/kernel/cpu.hpp"
#include "bd/kernel/micro_kernel_portable.hpp"

#ifdef BD_KERNEL_X86
#include <immintrin.h>

namespace bd::kernel {
namespace avx512 {

struct OpsFloat {
  using V = __m512;
  static constexpr Index lanes = 16;
  BD_TARGET_AVX512 static inline __attribute__((always_inline)) V load(const float* p) { return _mm512_loadu_ps(p); }
  BD_TARGET_AVX512 static inline __attribute__((always_inline)) void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  BD_TARGET_AVX512 static inline __attribute__((always_inline)) V set1(float s) { return _mm512_set1_ps(s); }
  BD_TARGET_AVX512 static inline __attribute__((always_inline)) V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
};
struct OpsDouble {
  using V = __m512d;
  static constexpr Index lanes = 8;
  BD_TARGET_AVX512 static inline __attribute__((always_inline)) V load(const double* p) { return _mm512_loadu_pd(p); }
  BD_TARGET_AVX512 static inline __attribute__((always_inline)) void store(double* p, V v) { _mm512_storeu_pd(p, v); }
  BD_TARGET_AVX512 static inline __attribute__((always_inline)) V set1(double s) { return _mm512_set1_pd(s); }
  BD_TARGET_AVX512 static inline __attribute__((always_inline)) V fma(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
};

template <int N, int NR, typename Ops, typename T>
BD_TARGET_AVX512 inline __attribute__((always_inline)) void tile_columns(Index kc, const T* A, const T* B,
                                                                       const T* const* src, const T* values, T* const* dst) {
  using V = typename Ops::V;
  constexpr Index W = Ops::lanes;
  V c0[N], c1[N];  // the loops over j are unrolled, so c0/c1 live in registers at -O2 too
#pragma GCC unroll 16
  for (int j = 0; j < N; ++j) {
    if (src) c0[j] = Ops::load(src[j]), c1[j] = Ops::load(src[j] + W);
    else c0[j] = c1[j] = Ops::set1(values ? values[j] : T(0));
  }
  for (Index k = 0; k < kc; ++k, A += 2 * W, B += NR) {
    const V a0 = Ops::load(A), a1 = Ops::load(A + W);
#pragma GCC unroll 16
    for (int j = 0; j < N; ++j) {
      const V b = Ops::set1(B[j]);
      c0[j] = Ops::fma(a0, b, c0[j]), c1[j] = Ops::fma(a1, b, c1[j]);
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < N; ++j) Ops::store(dst[j], c0[j]), Ops::store(dst[j] + W, c1[j]);
}

/// result[c·4 + i] = rows[i, :]·columns[c] for R rows and NC columns at once: every vector of a
/// column is loaded once for all rows, every vector of a row once for all columns.
template <int NC, int R, typename Ops, typename T>
BD_TARGET_AVX512 inline __attribute__((always_inline)) void dot_block(const T* rows, Index depth, const T* const* columns,
                                                                   T* result) {
  using V = typename Ops::V;
  constexpr Index W = Ops::lanes;
  V acc[NC][R];
#pragma GCC unroll 16
  for (int c = 0; c < NC; ++c)
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) acc[c][i] = Ops::set1(T(0));
  Index k = 0;
  for (; k + W <= depth; k += W) {
    V col[NC];
#pragma GCC unroll 16
    for (int c = 0; c < NC; ++c) col[c] = Ops::load(columns[c] + k);
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const V row = Ops::load(rows + i * depth + k);
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) acc[c][i] = Ops::fma(row, col[c], acc[c][i]);
    }
  }
  for (int c = 0; c < NC; ++c)
    for (int i = 0; i < R; ++i) {
      alignas(64) T lanes[W];
      Ops::store(lanes, acc[c][i]);
      T sum(0);
      for (Index l = 0; l < W; ++l) sum += lanes[l];
      for (Index t = k; t < depth; ++t) sum += rows[i * depth + t] * columns[c][t];
      result[c * 4 + i] = sum;
    }
}

template <int NC, typename Ops, typename T>
BD_TARGET_AVX512 inline void dot_columns(Index count, const T* rows, Index depth, const T* const* columns, T* result) {
  switch (count) {
    case 1: return dot_block<NC, 1, Ops>(rows, depth, columns, result);
    case 2: return dot_block<NC, 2, Ops>(rows, depth, columns, result);
    case 3: return dot_block<NC, 3, Ops>(rows, depth, columns, result);
    default: return dot_block<NC, 4, Ops>(rows, depth, columns, result);
  }
}

}  // namespace avx512

/// float: 32 × 12; double: 16 × 12.
template <typename T>
struct Avx512Kernel {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "AVX-512 kernels exist for float and double");
  using Ops = std::conditional_t<std::is_same_v<T, float>, avx512::OpsFloat, avx512::OpsDouble>;
  static constexpr Index mr = 2 * Ops::lanes;
  static constexpr Index nr = 12;
  static constexpr bool any_width = true;

  BD_TARGET_AVX512 static void tile(Index columns, Index kc, const T* A, const T* B, const T* const* src, const T* values,
                                    T* const* dst) {
    switch (columns) {
      case 12: return avx512::tile_columns<12, nr, Ops>(kc, A, B, src, values, dst);
      case 11: return avx512::tile_columns<11, nr, Ops>(kc, A, B, src, values, dst);
      case 10: return avx512::tile_columns<10, nr, Ops>(kc, A, B, src, values, dst);
      case 9: return avx512::tile_columns<9, nr, Ops>(kc, A, B, src, values, dst);
      case 8: return avx512::tile_columns<8, nr, Ops>(kc, A, B, src, values, dst);
      case 7: return avx512::tile_columns<7, nr, Ops>(kc, A, B, src, values, dst);
      case 6: return avx512::tile_columns<6, nr, Ops>(kc, A, B, src, values, dst);
      case 5: return avx512::tile_columns<5, nr, Ops>(kc, A, B, src, values, dst);
      case 4: return avx512::tile_columns<4, nr, Ops>(kc, A, B, src, values, dst);
      case 3: return avx512::tile_columns<3, nr, Ops>(kc, A, B, src, values, dst);
      case 2: return avx512::tile_columns<2, nr, Ops>(kc, A, B, src, values, dst);
      default: return avx512::tile_columns<1, nr, Ops>(kc, A, B, src, values, dst);
    }
  }
  /// Decoding (skinny.hpp): result[c·4 + i] = rows[i, :]·columns[c], i < count ≤ 4, c < dot_width.
  static constexpr Index dot_width = 4;
  static void dot_columns(Index count, const T* rows, Index depth, const T* const* columns, T* result) {
    avx512::dot_columns<dot_width, Ops>(count, rows, depth, columns, result);
  }
};

}  // namespace bd::kernel
#endif
