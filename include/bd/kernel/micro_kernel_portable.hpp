// bd/kernel/micro_kernel_portable.hpp — the micro-kernels without an instruction-set attribute:
// any CPU, any compiler, any arithmetic type; the fallback where neither AVX2 nor AVX-512 is.
// Under GCC and Clang, float and double run micro_kernel_simd.inc's bodies on 16-byte vectors
// of the compilers' vector extension (the target's baseline: SSE2 on x86-64, NEON on AArch64,
// scalars where there is none); other types and compilers on one scalar at a time.
//
// Every ISA provides the same two operations (see micro_kernel_avx2.hpp for the contract):
//   tile      acc(MR × NR) = start; acc += A·B over kc; dst = acc   (packed A and B)
//   dot_columns  result[c·4 + i] = rows[i, :]·B[:, c], up to four contiguous rows against a run
//                of B's columns (decoding)
// and the small factorizations (lu_rows, qr_pivots).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "bd/kernel/arguments.hpp"
#include "bd/kernel/cpu.hpp"

// On x86 these bodies run only where the CPU lacks AVX2, FMA or F16C (before 2013) or BD_CPU
// forces them, yet every program that includes bd compiles them: there they are compiled for size
// (`cold`: no unrolling, no inlining that grows code; the hand-written 16-byte vectors stay).
// PortableKernel::tile keeps the program's flags: its loops are vectorised by the compiler.
#if defined(BD_KERNEL_X86)
#define BD_PORTABLE_COLD __attribute__((cold))
#else
#define BD_PORTABLE_COLD
#endif
namespace bd::kernel {
namespace portable {

/// micro_kernel_simd.inc's operations on one scalar (lanes = 1): its bodies in plain C++, for
/// types other than float and double and compilers without the vector extension.
template <typename T>
struct Ops {
  using V = T;
  static constexpr Index lanes = 1;
  static V load(const T* p) { return *p; }
  static V load(const Eigen::bfloat16* p) { return static_cast<T>(static_cast<float>(*p)); }
  static void store(T* p, V v) { *p = v; }
  static V set1(T s) { return s; }
  static V fma(V a, V b, V c) { return a * b + c; }
  static V add(V a, V b) { return a + b; }
  static T sum(V v) { return v; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  static V max(V a, V b) { return a < b ? b : a; }
  static V exp(V x) { return std::exp(x); }
};

#if defined(__GNUC__) || defined(__clang__)
#define BD_PORTABLE_VECTORS 1
/// micro_kernel_simd.inc's operations on 16 bytes of T (4 floats, 2 doubles) through the vector
/// extension GCC and Clang share. Loads and stores go through memcpy (unaligned, no aliasing
/// assumption); max selects by the comparison's mask, as the scalar a < b ? b : a does.
template <typename T>
struct VectorOps {
  typedef T V __attribute__((vector_size(16)));
  static constexpr Index lanes = Index(16 / sizeof(T));
  static V load(const T* p) {
    V v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static V load(const Eigen::bfloat16* p) {
    V v;
    for (Index i = 0; i < lanes; ++i) v[i] = static_cast<T>(static_cast<float>(p[i]));
    return v;
  }
  static void store(T* p, V v) { std::memcpy(p, &v, sizeof v); }
  static V set1(T s) { return V{} + s; }
  static V fma(V a, V b, V c) { return a * b + c; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  static V max(V a, V b) {
    using Mask = decltype(a < b);
    const Mask take_b = a < b;
    return (V)(((Mask)b & take_b) | ((Mask)a & ~take_b));
  }
  /// Σ of the lanes pairwise, as the AVX kernels' horizontal sums.
  static T sum(V v) {
    if constexpr (lanes == 4) return (v[0] + v[2]) + (v[1] + v[3]);
    else return v[0] + v[1];
  }
  static V exp(V x) {
    for (Index i = 0; i < lanes; ++i) x[i] = std::exp(x[i]);
    return x;
  }
};
template <typename T>
using OpsFor = std::conditional_t<std::is_same_v<T, float> || std::is_same_v<T, double>, VectorOps<T>, Ops<T>>;
// The bodies are vectorised by hand here too: GCC's loop vectoriser would only vectorise their
// scalar tails again (see cpu.hpp's BD_HAND_VECTORISED).
#if defined(__clang__)
#define BD_KERNEL_TARGET BD_PORTABLE_COLD
#else
#define BD_KERNEL_TARGET __attribute__((optimize("no-tree-loop-vectorize"))) BD_PORTABLE_COLD
#endif
#else
template <typename T>
using OpsFor = Ops<T>;
#define BD_KERNEL_TARGET
#endif
#define BD_KERNEL_NAMESPACE portable
#include "bd/kernel/micro_kernel_simd.inc"
#undef BD_KERNEL_NAMESPACE
#undef BD_KERNEL_TARGET

}  // namespace portable

/// 8 × 4 (micro_kernel_simd.inc's Routines), with its own tile and LU.
template <typename T>
struct PortableKernel : portable::Routines<portable::OpsFor<T>, T, 8, 4> {
  using Base = portable::Routines<portable::OpsFor<T>, T, 8, 4>;
  static constexpr Index mr = Base::mr, nr = Base::nr;  // named here for tile_on's bounds
  /// tile() always computes all NR columns (fixed bounds the compiler vectorises), so it never
  /// reads B in place, where columns past an edge may not exist (Context::strided_tiles).
  static constexpr bool any_width = false;

  /// src[j] / dst[j] point at row 0 of the tile's column j; src null: column j starts from
  /// values[j] (0 when values is null). A: packed MR × kc (k-major); B(k, j) at B[k·ldb + j]
  /// (packed: ldb = nr), or Transposed at B[j·ldb + k].
  template <bool Transposed>
#if defined(__GNUC__) && !defined(__clang__)
  // GCC 12's SLP vectoriser, given AVX-512 (-march=x86-64-v4), turns acc into a stack array
  // shuffled lane by lane: 10x slower than scalar code. The loop vectoriser alone does well.
  __attribute__((optimize("no-tree-slp-vectorize")))
#endif
  static void tile_on(Index kc, const T* A, const T* B, Index ldb, const T* const* src, const T* values, T* const* dst) {
    T acc[nr][mr];
    for (Index j = 0; j < nr; ++j)
      for (Index i = 0; i < mr; ++i) acc[j][i] = src ? src[j][i] : values ? values[j] : T(0);
    for (Index k = 0; k < kc; ++k, A += mr)
      for (Index j = 0; j < nr; ++j) {
        const T b = Transposed ? B[j * ldb + k] : B[k * ldb + j];
        for (Index i = 0; i < mr; ++i) acc[j][i] += A[i] * b;
      }
    for (Index j = 0; j < nr; ++j)
      for (Index i = 0; i < mr; ++i) dst[j][i] = acc[j][i];
  }
  static void tile(Index /*columns*/, Index kc, const T* A, const T* B, Index ldb, const T* const* src, const T* values,
                   T* const* dst, Index /*prefetch*/) {
    tile_on<false>(kc, A, B, ldb, src, values, dst);
  }
  static void tile_transposed(Index /*columns*/, Index kc, const T* A, const T* B, Index ldb, const T* const* src,
                              const T* values, T* const* dst, Index /*prefetch*/) {
    tile_on<true>(kc, A, B, ldb, src, values, dst);
  }

  /// P·A = L·U in place for a small row-major A: micro_kernel_simd.inc's lu_rows with scalars
  /// (same layout, pivots and multipliers; the padding and scratch row are not read).
  BD_PORTABLE_COLD static void lu_rows(T* a, Index n, Index ld, Index* perm) {
    for (Index i = 0; i < n; ++i) perm[i] = i;
    Index p = 0;
    for (Index i = 1; i < n; ++i)
      if (std::abs(a[i * ld]) > std::abs(a[p * ld])) p = i;
    for (Index k = 0; k < n; ++k) {
      T* rk = a + k * ld;
      if (p != k) {
        std::swap_ranges(rk, rk + n, a + p * ld);
        std::swap(perm[k], perm[p]);
      }
      const T pivot = rk[k];
      const T inverse = pivot == T(0) ? T(0) : T(1) / pivot;
      Index next = k + 1;
      T best = T(-1);
      for (Index i = k + 1; i < n; ++i) {
        T* ri = a + i * ld;
        const T l = ri[k] * inverse;
        if (pivot != T(0)) ri[k] = l;
        if (l != T(0))
          for (Index j = k + 1; j < n; ++j) ri[j] -= l * rk[j];
        if (k + 1 < n && std::abs(ri[k + 1]) > best) best = std::abs(ri[k + 1]), next = i;
      }
      p = next;
    }
  }
};

}  // namespace bd::kernel
