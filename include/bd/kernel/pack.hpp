// bd/kernel/pack.hpp — packing, where BD's gather and the storage conversion happen.
//
//   pack_a: rows of X's channels into MR-row panels, k-major inside a panel. The channels are a
//           segment's list, so BD's X[:, rest] (a window's two neighbours, or a head's pivoted
//           rest channels) is gathered here, MR contiguous values at a time, and never formed.
//   pack_b: B's columns into NR-column panels, k-major inside a panel, pass by pass; B is
//           converted from its storage type (half, bfloat16) to the arithmetic type here, so no
//           converted copy of a whole matrix exists.
// Both pad with zeros past the edge, so the micro-kernel always sees full panels. For bf16
// compute (arguments.hpp's Compute) pack_bf16_a and pack_bf16_b round both operands to bfloat16
// here, once, into one of two layouts (Packing): bf16 pairs, a 32-bit word per two channels, which
// vdpbf16ps multiplies; or the rounded values as floats, each pair's channels swapped, which
// the fp32 tile's FMAs then sum in vdpbf16ps's order — the same bits on every CPU.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <Eigen/Core>

#ifdef __SSE2__
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

#include "bd/kernel/arguments.hpp"
#include "bd/kernel/convert.hpp"

namespace bd::kernel::detail {

inline Index round_up(Index value, Index multiple) { return (value + multiple - 1) / multiple * multiple; }

/// The largest tile of any micro-kernel (AVX-512's float tile, 32 × 12): the loops compiled once
/// per scalar type (loop.hpp, flash_attention.hpp) size their per-tile arrays by it.
inline constexpr Index max_tile_rows = 32, max_tile_columns = 12;

/// Splits `depth` into passes of at most `kc`, all of equal size but the last; `even`: of an even
/// size (bf16 pairs never straddle two passes, so the blocking cannot move a pair), which may
/// exceed kc by one.
inline Index pass_depth(Index depth, Index kc, bool even = false) {
  const Index passes = std::max<Index>(1, (depth + kc - 1) / std::max<Index>(1, kc));
  const Index pass = std::max<Index>(1, (depth + passes - 1) / passes);
  return even ? (pass + 1) / 2 * 2 : pass;
}

/// How a packed panel holds its operand: as it is (fp32 compute); rounded to bfloat16, held in
/// floats, the channels of each pair swapped (bf16 by FMAs: vdpbf16ps adds a pair's odd product
/// first, then its even one, each FMA rounded once); or as bf16 pairs, channel 2k in the low half
/// of word k and 2k + 1 in its high half (bf16 by vdpbf16ps).
enum class Packing { Plain, Rounded, Pairs };

/// Whether a kernel has a tile on bf16 pairs (vdpbf16ps: AVX-512's float kernel).
template <typename Kernel, typename = void>
struct has_pair_tile : std::false_type {};
template <typename Kernel>
struct has_pair_tile<Kernel, std::enable_if_t<Kernel::pair_tiles>> : std::true_type {};

/// Whether Kernel rounds Packing::Rounded's panels in vector registers (round_channels,
/// round_rows: float, AVX2 and AVX-512); others use round_panel below.
template <typename Kernel, typename = void>
struct has_rounding : std::false_type {};
template <typename Kernel>
struct has_rounding<Kernel, std::enable_if_t<Kernel::rounds_panels>> : std::true_type {};

/// The k-steps of a panel packing kn channels: kn, kn rounded up to even (a pair's missing half
/// is a zero), or the pairs.
inline Index packed_depth(Packing p, Index kn) {
  return p == Packing::Plain ? kn : p == Packing::Rounded ? (kn + 1) / 2 * 2 : (kn + 1) / 2;
}

/// x rounded to bfloat16 (nearest even, NaN kept; a bfloat16 as it is), as a float.
inline float bf16_value(float x) { return float_of(std::uint32_t(bfloat16_bits(x)) << 16); }
inline float bf16_value(Eigen::bfloat16 x) { return float_of(std::uint32_t(x.value) << 16); }

/// dst[0, n) = src[0, n) converted (widen_one: the bfloat16 shift vectorises).
template <typename S, typename T>
void convert_column(const S* src, Index n, T* dst) {
  if constexpr (std::is_same_v<S, T>) {
    std::memcpy(dst, src, sizeof(T) * static_cast<std::size_t>(n));
  } else {
    for (Index k = 0; k < n; ++k) dst[k] = widen_one<T>(src[k]);
  }
}

#ifdef __SSE2__
/// Four runs × four k into the panel, transposed in registers: panel[(k + t)·Stride + c] = run c
/// at k + t. SSE2 is part of x86-64, so this needs no dispatch; it packs several times faster than
/// element by element, which is what BD pays per call at short L (B is read once per call).
template <Index Stride>
inline void transpose4x4_into(__m128 r0, __m128 r1, __m128 r2, __m128 r3, float* panel) {
  _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
  _mm_storeu_ps(panel, r0);
  _mm_storeu_ps(panel + Stride, r1);
  _mm_storeu_ps(panel + 2 * Stride, r2);
  _mm_storeu_ps(panel + 3 * Stride, r3);
}

/// Four bfloat16 values widened to float: the 16 bits become the upper half of each float.
inline __m128 load4_bf16(const Eigen::bfloat16* p) {
  std::uint64_t bits;
  std::memcpy(&bits, p, sizeof bits);
  const __m128i halves = _mm_cvtsi64_si128(static_cast<long long>(bits));
  return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), halves));
}
#endif

/// panel[k·Stride + c] = run(c)[k] for c in [0, count) and k in [0, kn): `count` runs that are
/// contiguous along k (B's columns, or X's rows read in place) transposed into a k-major panel,
/// 4 × 4 floats or 2 × 2 doubles at a time in SSE2 registers. Returns how many runs it did (a
/// multiple of 4 or 2; none without SSE2 or for other types): the caller does the rest.
template <Index Stride, typename T, typename S, typename Run>
Index transpose_runs(Run run, Index count, Index kn, T* panel) {
  Index c = 0;
#ifdef __SSE2__
  if constexpr (std::is_same_v<T, float> && (std::is_same_v<S, float> || std::is_same_v<S, Eigen::bfloat16>)) {
    for (; c + 4 <= count; c += 4) {
      const S *p0 = run(c), *p1 = run(c + 1), *p2 = run(c + 2), *p3 = run(c + 3);
      Index k = 0;
      for (; k + 4 <= kn; k += 4) {
        if constexpr (std::is_same_v<S, float>)
          transpose4x4_into<Stride>(_mm_loadu_ps(p0 + k), _mm_loadu_ps(p1 + k), _mm_loadu_ps(p2 + k),
                                    _mm_loadu_ps(p3 + k), panel + k * Stride + c);
        else
          transpose4x4_into<Stride>(load4_bf16(p0 + k), load4_bf16(p1 + k), load4_bf16(p2 + k), load4_bf16(p3 + k),
                                    panel + k * Stride + c);
      }
      for (; k < kn; ++k)
        for (Index t = 0; t < 4; ++t) panel[k * Stride + c + t] = static_cast<T>(run(c + t)[k]);
    }
  } else if constexpr (std::is_same_v<T, double> && std::is_same_v<S, double>) {
    for (; c + 2 <= count; c += 2) {
      const double *p0 = run(c), *p1 = run(c + 1);
      Index k = 0;
      for (; k + 2 <= kn; k += 2) {
        const __m128d a = _mm_loadu_pd(p0 + k), b = _mm_loadu_pd(p1 + k);
        _mm_storeu_pd(panel + k * Stride + c, _mm_unpacklo_pd(a, b));
        _mm_storeu_pd(panel + (k + 1) * Stride + c, _mm_unpackhi_pd(a, b));
      }
      if (k < kn) panel[k * Stride + c] = p0[k], panel[k * Stride + c + 1] = p1[k];
    }
  }
#else
  (void)run, (void)count, (void)kn, (void)panel;
#endif
  return c;
}

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
        if constexpr (std::is_same_v<S, T>) {
          if (wj == NR) {  // a fixed-size copy: a few vector moves
            std::memcpy(to, row, sizeof(T) * NR);
            continue;
          }
        }
        for (Index j = 0; j < wj; ++j) to[j] = static_cast<T>(row[j]);
        for (Index j = wj; j < NR; ++j) to[j] = T(0);
      }
    }
    return;
  }
  for (Index j0 = 0; j0 < round_up(w, NR); j0 += NR) {
    T* panel = packed + j0 * kn;
    const auto column = [&](Index j) { return a.b + (c0 + j0 + j) * a.ldb + k0; };
    Index j = transpose_runs<NR, T, S>(column, std::min(NR, w - j0), kn, panel);
    for (; j < NR; ++j) {
      if (j0 + j >= w) {
        for (Index k = 0; k < kn; ++k) panel[k * NR + j] = T(0);
        continue;
      }
      const S* col = column(j);
      for (Index k = 0; k < kn; ++k) panel[k * NR + j] = widen_one<T>(col[k]);
    }
  }
}

/// Packs rows [r0, r0 + m) of the segment's channels [k0, k0 + kn) into MR-row panels, k-major
/// inside a panel, zero rows past m.
template <Index MR, typename T, typename S>
void pack_a(const GemmArguments<T, S>& a, const Segment& seg, Index r0, Index m, Index k0, Index kn, T* packed) {
  if (a.x_row_major) {
    // Row i of X is contiguous along the channels: read it once, scatter into the panel; when
    // the pass's channels are consecutive (a product's, not a gather), four rows at a time
    // transposed in registers.
    const Index* channels = seg.channels + k0;
    bool consecutive = true;
    for (Index k = 1; k < kn && consecutive; ++k) consecutive = channels[k] == channels[0] + k;
    for (Index i0 = 0; i0 < m; i0 += MR) {
      T* panel = packed + i0 * kn;
      const Index mi = std::min(MR, m - i0);
      const auto row_run = [&](Index i) { return a.x + (r0 + i0 + i) * a.ldx + channels[0]; };
      const Index done = consecutive && kn > 0 ? transpose_runs<MR, T, T>(row_run, mi, kn, panel) : 0;
      for (Index i = done; i < MR; ++i) {
        if (i >= mi) {
          for (Index k = 0; k < kn; ++k) panel[k * MR + i] = T(0);
          continue;
        }
        const T* row = a.x + (r0 + i0 + i) * a.ldx;
        for (Index k = 0; k < kn; ++k) panel[k * MR + i] = row[channels[k]];
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

/// A float's bits rounded to bfloat16 (nearest even; NaN kept, made quiet), in the word's upper
/// half with the lower half zero: branch-free, so that the packing loops vectorise.
inline std::uint32_t bf16_upper(std::uint32_t x) {
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) & 0xffff0000u;
  const std::uint32_t quiet = (x | 0x00400000u) & 0xffff0000u;
  return (x & 0x7fffffffu) > 0x7f800000u ? quiet : rounded;
}
inline std::uint32_t bf16_upper(float x) { return bf16_upper(bits_of(x)); }
inline std::uint32_t bf16_upper(Eigen::bfloat16 x) { return std::uint32_t(x.value) << 16; }

/// The packing buffer's 32-bit words as words (the bf16 pairs live in a buffer of floats).
using PackedWord = std::uint32_t
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((may_alias))
#endif
    ;

/// A float panel of kn k-steps, `lanes` values each (k-major: panel[k·lanes + i], as the packing
/// lays out A's, B's and attention's panels), rounded to bfloat16 in place into Packing::Rounded's
/// layout: each pair's two steps swapped; an odd kn's last step moves one down, a zero before it,
/// so the panel needs room for kn + 1 steps.
inline void round_panel(float* panel, Index lanes, Index kn) {
  PackedWord* words = reinterpret_cast<PackedWord*>(panel);
  for (Index t = 0; t < kn / 2; ++t) {
    PackedWord* even = words + 2 * t * lanes;
    PackedWord* odd = even + lanes;
    for (Index i = 0; i < lanes; ++i) {
      const std::uint32_t e = even[i], o = odd[i];
      even[i] = bf16_upper(o), odd[i] = bf16_upper(e);
    }
  }
  if (kn % 2 == 0) return;
  PackedWord* last = words + (kn - 1) * lanes;
  for (Index i = 0; i < lanes; ++i) last[lanes + i] = bf16_upper(last[i]), last[i] = 0u;
}

/// pack_a for bf16 compute (T float) from X's channels already rounded to bfloat16 (a column-major
/// copy, loop.hpp's RoundedInput: a thread packs its rows once per column block, and rounding
/// them each time cost more than the packing): rows [r0, r0 + m) of the segment's channels
/// [k0, k0 + kn) as MR-row panels of packed_depth(P, kn) k-steps, zero rows past m. `Paired`: the
/// copy's columns are Pairs' words already, channel k0 + 2t's list entry naming pair t's column.
template <Index MR, Packing P, typename T, typename S, bool Paired = false>
void pack_bf16_a(const GemmArguments<T, S>& a, const Segment& seg, Index r0, Index m, Index k0, Index kn, T* packed) {
  static_assert(std::is_same_v<T, float> && P != Packing::Plain && (!Paired || P == Packing::Pairs),
                "bf16 packing: float arithmetic; paired columns for Pairs");
  assert(!a.x_row_major);
  const Index steps = packed_depth(P, kn);
  const auto column = [&](Index k) -> const PackedWord* {
    return k < kn ? reinterpret_cast<const PackedWord*>(a.x + seg.channels[k0 + k] * a.ldx) : nullptr;
  };
  for (Index i0 = 0; i0 < m; i0 += MR) {
    PackedWord* panel = reinterpret_cast<PackedWord*>(packed + i0 * steps);
    const Index mi = std::min(MR, m - i0), row0 = r0 + i0;
    for (Index k = 0; k < steps; ++k) {
      PackedWord* to = panel + k * MR;
      if constexpr (Paired) {
        const PackedWord* from = column(2 * k) + row0;
        std::copy(from, from + mi, to);
      } else if constexpr (P == Packing::Rounded) {  // the pair's other channel: k ^ 1
        if (const PackedWord* from = column(k ^ 1)) std::copy(from + row0, from + row0 + mi, to);
        else std::fill(to, to + mi, 0u);
      } else {  // channel 2k in the low half, 2k + 1 in the high half
        const PackedWord *lo = column(2 * k) + row0, *hi = column(2 * k + 1);
        if (hi) {
          hi += row0;
          for (Index i = 0; i < mi; ++i) to[i] = hi[i] | lo[i] >> 16;
        } else {
          for (Index i = 0; i < mi; ++i) to[i] = lo[i] >> 16;
        }
      }
      std::fill(to + mi, to + MR, 0u);
    }
  }
}

/// pack_b for bf16 compute: B's columns [c0, c0 + w), rows [k0, k0 + kn), rounded to bfloat16
/// (a bfloat16 B as it is), as NR-column panels of packed_depth(P, kn) k-steps, zero columns past
/// w. Column by column, each one run of B when B is column-major.
template <Index NR, Packing P, typename T, typename S>
void pack_bf16_b(const GemmArguments<T, S>& a, Index c0, Index w, Index k0, Index kn, T* packed) {
  static_assert(std::is_same_v<T, float> && (std::is_same_v<S, float> || std::is_same_v<S, Eigen::bfloat16>) &&
                    P != Packing::Plain,
                "bf16 packing: float arithmetic, B stored in float or bfloat16");
  const Index steps = packed_depth(P, kn), pairs = kn / 2;  // whole pairs; an odd kn leaves a last half
  if constexpr (P == Packing::Rounded) {
    // Each panel packed as for f32 (pack_b's transposes, a bf16 B widened exactly), then rounded
    // in place, each pair's two k-steps swapped; an odd kn's last half moves one step down, a
    // zero before it.
    for (Index j0 = 0; j0 < round_up(w, NR); j0 += NR) {
      T* panel = packed + j0 * steps;
      pack_b<NR>(a, c0 + j0, std::min(NR, w - j0), k0, kn, panel);
      round_panel(panel, NR, kn);
    }
    return;
  }
  const Index stride = a.b_row_major ? a.ldb : 1;  // between B(k, c) and B(k + 1, c)
  for (Index j0 = 0; j0 < round_up(w, NR); j0 += NR) {
    T* panel = packed + j0 * steps;
    PackedWord* words = reinterpret_cast<PackedWord*>(panel);
    const Index wj = std::min(NR, w - j0);
    for (Index j = 0; j < wj; ++j) {
      const S* col = a.b_row_major ? a.b + k0 * a.ldb + c0 + j0 + j : a.b + (c0 + j0 + j) * a.ldb + k0;
      for (Index t = 0; t < pairs; ++t)
        words[t * NR + j] = bf16_upper(col[(2 * t + 1) * stride]) | bf16_upper(col[2 * t * stride]) >> 16;
      if (kn % 2) words[pairs * NR + j] = bf16_upper(col[(kn - 1) * stride]) >> 16;
    }
    for (Index k = 0; k < steps; ++k) std::fill(panel + k * NR + wj, panel + (k + 1) * NR, T(0));
  }
}

}  // namespace bd::kernel::detail
