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

/// Packs B's columns [c0, c0 + w), rows [k0, k0 + kn) (one depth pass) into NR-column panels,
/// k-major inside a panel, zero columns past w.
template <Index NR, typename T, typename S>
void pack_b(const GemmArguments<T, S>& a, Index c0, Index w, Index k0, Index kn, T* packed) {
  for (Index j0 = 0; j0 < round_up(w, NR); j0 += NR) {
    T* panel = packed + j0 * kn;
    for (Index j = 0; j < NR; ++j) {
      if (j0 + j >= w) {
        for (Index k = 0; k < kn; ++k) panel[k * NR + j] = T(0);
        continue;
      }
      const S* column = a.b + (c0 + j0 + j) * a.ldb + k0;
      if constexpr (std::is_same_v<S, Eigen::bfloat16> && std::is_same_v<T, float>) {
        for (Index k = 0; k < kn; ++k) {  // see convert_column
          const std::uint32_t bits = std::uint32_t(column[k].value) << 16;
          std::memcpy(panel + k * NR + j, &bits, sizeof(float));
        }
      } else {
        for (Index k = 0; k < kn; ++k) panel[k * NR + j] = static_cast<T>(column[k]);
      }
    }
  }
}

/// Packs rows [r0, r0 + m) of the segment's channels [k0, k0 + kn) into MR-row panels, k-major
/// inside a panel, zero rows past m.
template <Index MR, typename T, typename S>
void pack_a(const GemmArguments<T, S>& a, const Segment& seg, Index r0, Index m, Index k0, Index kn, T* packed) {
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
