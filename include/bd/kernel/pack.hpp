// bd/kernel/pack.hpp — packing, where BD's gather and the storage conversion happen.
//
//   pack_a: rows of X's channels into MR-row panels, k-major inside a panel. The channels are a
//           segment's list, so BD's X[:, rest] (a window's two neighbours, or a head's pivoted
//           rest channels) is gathered here, MR contiguous values at a time, and never formed.
//   pack_b: B's columns into NR-column panels, k-major inside a panel, pass by pass; B is
//           converted from its storage type (half, bfloat16) to the arithmetic type here, so no
//           converted copy of a whole matrix exists.
// Both pad with zeros past the edge, so the micro-kernel always sees full panels.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <Eigen/Core>

#ifdef __SSE2__
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

#include "bd/kernel/arguments.hpp"

namespace bd::kernel::detail {

inline Index round_up(Index value, Index multiple) { return (value + multiple - 1) / multiple * multiple; }

/// Splits `depth` into passes of at most `kc`, all of equal size but the last.
inline Index pass_depth(Index depth, Index kc) {
  const Index passes = std::max<Index>(1, (depth + kc - 1) / std::max<Index>(1, kc));
  return std::max<Index>(1, (depth + passes - 1) / passes);
}

/// dst[0, n) = src[0, n) converted. bfloat16 → float is the upper half of the float's bits:
/// written as integer shifts so that the compiler vectorises it (the scalar conversion does not).
template <typename S, typename T>
void convert_column(const S* src, Index n, T* dst) {
  if constexpr (std::is_same_v<S, T>) {
    std::memcpy(dst, src, sizeof(T) * static_cast<std::size_t>(n));
  } else if constexpr (std::is_same_v<S, Eigen::bfloat16> && std::is_same_v<T, float>) {
    for (Index k = 0; k < n; ++k) {
      const std::uint32_t bits = std::uint32_t(src[k].value) << 16;
      std::memcpy(dst + k, &bits, sizeof(float));
    }
  } else {
    for (Index k = 0; k < n; ++k) dst[k] = static_cast<T>(src[k]);
  }
}

#ifdef __SSE2__
/// Four columns × four k of B into the panel, transposed in registers: panel[(k + t)·NR + j + c]
/// = column c at k + t. SSE2 is part of x86-64, so this needs no dispatch; it packs B 4–6× faster
/// than element by element, which is what BD pays per call at short L (B is read once per call).
template <Index NR>
inline void transpose4x4_into(__m128 r0, __m128 r1, __m128 r2, __m128 r3, float* panel) {
  _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
  _mm_storeu_ps(panel, r0);
  _mm_storeu_ps(panel + NR, r1);
  _mm_storeu_ps(panel + 2 * NR, r2);
  _mm_storeu_ps(panel + 3 * NR, r3);
}

/// Four bfloat16 values widened to float: the 16 bits become the upper half of each float.
inline __m128 load4_bf16(const Eigen::bfloat16* p) {
  std::uint64_t bits;
  std::memcpy(&bits, p, sizeof bits);
  const __m128i halves = _mm_cvtsi64_si128(static_cast<long long>(bits));
  return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), halves));
}
#endif

/// Packs B's columns [c0, c0 + w), rows [k0, k0 + kn) (one depth pass) into NR-column panels,
/// k-major inside a panel, zero columns past w.
template <Index NR, typename T, typename S>
void pack_b(const GemmArguments<T, S>& a, Index c0, Index w, Index k0, Index kn, T* packed) {
  if (a.b_row_major) {
    // A panel's row k is NR consecutive values of B's row k0 + k: a copy, no transpose.
    for (Index j0 = 0; j0 < round_up(w, NR); j0 += NR) {
      T* panel = packed + j0 * kn;
      const Index wj = std::min(NR, w - j0);
      for (Index k = 0; k < kn; ++k) {
        const S* row = a.b + (k0 + k) * a.ldb + c0 + j0;
        T* to = panel + k * NR;
        for (Index j = 0; j < wj; ++j) to[j] = static_cast<T>(row[j]);
        for (Index j = wj; j < NR; ++j) to[j] = T(0);
      }
    }
    return;
  }
  for (Index j0 = 0; j0 < round_up(w, NR); j0 += NR) {
    T* panel = packed + j0 * kn;
    const auto column = [&](Index j) { return a.b + (c0 + j0 + j) * a.ldb + k0; };
    Index j = 0;
#ifdef __SSE2__
    constexpr bool fp32 = std::is_same_v<T, float> && (std::is_same_v<S, float> || std::is_same_v<S, Eigen::bfloat16>);
    if constexpr (fp32) {
      for (; j + 4 <= NR && j0 + j + 4 <= w; j += 4) {
        const S *p0 = column(j), *p1 = column(j + 1), *p2 = column(j + 2), *p3 = column(j + 3);
        Index k = 0;
        for (; k + 4 <= kn; k += 4) {
          if constexpr (std::is_same_v<S, float>)
            transpose4x4_into<NR>(_mm_loadu_ps(p0 + k), _mm_loadu_ps(p1 + k), _mm_loadu_ps(p2 + k), _mm_loadu_ps(p3 + k),
                                  panel + k * NR + j);
          else
            transpose4x4_into<NR>(load4_bf16(p0 + k), load4_bf16(p1 + k), load4_bf16(p2 + k), load4_bf16(p3 + k),
                                  panel + k * NR + j);
        }
        for (; k < kn; ++k)
          for (Index c = 0; c < 4; ++c) panel[k * NR + j + c] = static_cast<T>(column(j + c)[k]);
      }
    }
#endif
    for (; j < NR; ++j) {
      if (j0 + j >= w) {
        for (Index k = 0; k < kn; ++k) panel[k * NR + j] = T(0);
        continue;
      }
      const S* col = column(j);
      if constexpr (std::is_same_v<S, Eigen::bfloat16> && std::is_same_v<T, float>) {
        for (Index k = 0; k < kn; ++k) {  // see convert_column
          const std::uint32_t bits = std::uint32_t(col[k].value) << 16;
          std::memcpy(panel + k * NR + j, &bits, sizeof(float));
        }
      } else {
        for (Index k = 0; k < kn; ++k) panel[k * NR + j] = static_cast<T>(col[k]);
      }
    }
  }
}

/// Packs rows [r0, r0 + m) of the segment's channels [k0, k0 + kn) into MR-row panels, k-major
/// inside a panel, zero rows past m.
template <Index MR, typename T, typename S>
void pack_a(const GemmArguments<T, S>& a, const Segment& seg, Index r0, Index m, Index k0, Index kn, T* packed) {
  if (a.x_row_major) {
    // Row i of X is contiguous along the channels: read it once, scatter into the panel.
    for (Index i0 = 0; i0 < m; i0 += MR) {
      T* panel = packed + i0 * kn;
      const Index mi = std::min(MR, m - i0);
      for (Index i = 0; i < MR; ++i) {
        if (i >= mi) {
          for (Index k = 0; k < kn; ++k) panel[k * MR + i] = T(0);
          continue;
        }
        const T* row = a.x + (r0 + i0 + i) * a.ldx;
        for (Index k = 0; k < kn; ++k) panel[k * MR + i] = row[seg.channels[k0 + k]];
      }
    }
    return;
  }
  for (Index i0 = 0; i0 < m; i0 += MR) {
    T* panel = packed + i0 * kn;
    const Index mi = std::min(MR, m - i0);
    for (Index k = 0; k < kn; ++k) {
      const T* column = a.x + seg.channels[k0 + k] * a.ldx + r0 + i0;
      T* to = panel + k * MR;
      if (mi == MR) {
        std::memcpy(to, column, sizeof(T) * MR);
      } else {
        std::memcpy(to, column, sizeof(T) * static_cast<std::size_t>(mi));
        std::fill(to + mi, to + MR, T(0));
      }
    }
  }
}

}  // namespace bd::kernel::detail
