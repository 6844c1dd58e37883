// bd/core/gemm_kernel.hpp — the packed GEMM behind every BD projection:
//
//     out[:, col(c)] = init(c) + Σ_k X[:, chan(k)] · B(k, c)          for c in a segment
//
// Three things a plain GEMM call cannot do, done where they cost nothing:
//   * the columns of X are gathered while packing (a window's two neighbours, one head's
//     pivoted rest channels, or all channels), so BD's X[:, rest] is never formed;
//   * each accumulator starts from init(c) — BD's basis channel X[:, s(c)], a bias value or
//     zero — so the output is written once, not filled and then updated (DESIGN.md §4);
//   * B is converted from its storage type (half, bfloat16) while packing, one panel at a time.
//
// The structure is BLIS's (Van Zee & van de Geijn, 2015), transposed for column-major output:
// a register-resident MR × NR micro-tile (MR rows along SIMD lanes, NR columns broadcast),
// packed A panels (MR rows × kc) in L2, a packed B micro-panel (kc × NR) in L1 across the
// row loop, kc split evenly so the K loop needs no remainder block. Each OpenMP thread owns an
// equal share of the columns (and of the rows when columns are few); every buffer is allocated
// before the parallel region, so nothing inside it can throw.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define BD_GEMM_AVX2 1
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

namespace bd::kernel {

using Index = Eigen::Index;

/// Cache blocking. mc rows of X per packed A block (rounded up to MR), kc of the K dimension
/// per pass (K is split into equal passes of at most kc, so a B micro-panel kc × NR and an A
/// micro-panel MR × kc share L1), nc output columns per task (rounded up to NR). The defaults
/// were chosen on AVX2 (2-core EPYC, bench/bench_kproj.cpp); differences of a few percent
/// between neighbouring choices were within that machine's run-to-run noise.
struct Blocking {
  Index mc = 144;
  Index kc = 256;
  Index nc = 768;
};

/// Micro-tile shape per scalar: two SIMD registers of rows by six broadcast columns on AVX2
/// (12 accumulators + 2 A registers + 1 broadcast = 15 of 16 ymm), a portable shape elsewhere.
template <typename T>
struct MicroTile {
#ifdef BD_GEMM_AVX2
  static constexpr Index mr = std::is_same_v<T, float> ? 16 : std::is_same_v<T, double> ? 8 : 8;
  static constexpr Index nr = 6;
  static constexpr bool any_width = std::is_same_v<T, float> || std::is_same_v<T, double>;  // kernels for 1..nr columns
#else
  static constexpr Index mr = 8;
  static constexpr Index nr = 4;
  static constexpr bool any_width = false;
#endif
};

/// Columns [first_column, first_column + width) of B and of the output that share one list of
/// X channels as their K dimension (`depth` channels, read in list order against B's rows).
struct Segment {
  const Index* channels = nullptr;
  Index depth = 0;
  Index first_column = 0;
  Index width = 0;
};

/// One GEMM, described by pointers (column-major everywhere).
template <typename T, typename S>
struct GemmArguments {
  Index rows = 0;                        ///< L
  const T* x = nullptr;                  ///< X (L × any), leading dimension ldx ≥ L
  Index ldx = 0;
  const S* b = nullptr;                  ///< B (K × N), leading dimension ldb
  Index ldb = 0;
  T* out = nullptr;                      ///< output, leading dimension ldo ≥ L
  Index ldo = 0;
  const Index* out_columns = nullptr;    ///< output column of each B column; null: the same index
  const Index* init_channels = nullptr;  ///< X channel each output column starts from; null: none
  const T* init_values = nullptr;        ///< value each output column starts from (a bias); null: 0
  std::vector<Segment> segments;
};

namespace detail {

/// acc(MR × NR) = init; acc += A·B over kc; dst = acc. A: packed MR × kc (k-major), B: packed
/// kc × NR (k-major). src[j]/dst[j] point at row 0 of the tile's column j; src may be null,
/// then column j starts from values[j] (or 0 when values is null).
template <typename T>
inline void micro_kernel_portable(Index kc, const T* A, const T* B, const T* const* src, const T* values, T* const* dst) {
  constexpr Index MR = MicroTile<T>::mr, NR = MicroTile<T>::nr;
  T acc[NR][MR];
  for (Index j = 0; j < NR; ++j)
    for (Index i = 0; i < MR; ++i) acc[j][i] = src ? src[j][i] : values ? values[j] : T(0);
  for (Index k = 0; k < kc; ++k, A += MR, B += NR)
    for (Index j = 0; j < NR; ++j)
      for (Index i = 0; i < MR; ++i) acc[j][i] += A[i] * B[j];
  for (Index j = 0; j < NR; ++j)
    for (Index i = 0; i < MR; ++i) dst[j][i] = acc[j][i];
}

#ifdef BD_GEMM_AVX2
// The same for float/double on AVX2 + FMA, for the first N of the panel's NR columns (N < NR
// only at the last panel of a segment): 2 loads of A, N broadcasts of B, 2N FMAs per k.
template <int N, typename V, typename T, typename Ops>
inline __attribute__((always_inline)) void micro_kernel_avx2(Index kc, const T* A, const T* B, const T* const* src,
                                                             const T* values, T* const* dst) {
  constexpr Index W = 32 / sizeof(T), NR = MicroTile<T>::nr;  // lanes per register
  V c0[N], c1[N];
  for (int j = 0; j < N; ++j) {
    if (src) {
      c0[j] = Ops::load(src[j]), c1[j] = Ops::load(src[j] + W);
    } else {
      c0[j] = c1[j] = Ops::set1(values ? values[j] : T(0));
    }
  }
  for (Index k = 0; k < kc; ++k, A += 2 * W, B += NR) {
    const V a0 = Ops::load(A), a1 = Ops::load(A + W);
    for (int j = 0; j < N; ++j) {
      const V b = Ops::set1(B[j]);
      c0[j] = Ops::fma(a0, b, c0[j]), c1[j] = Ops::fma(a1, b, c1[j]);
    }
  }
  for (int j = 0; j < N; ++j) Ops::store(dst[j], c0[j]), Ops::store(dst[j] + W, c1[j]);
}

struct OpsFloat {
  static __m256 load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
  static __m256 set1(float s) { return _mm256_set1_ps(s); }
  static __m256 fma(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
};
struct OpsDouble {
  static __m256d load(const double* p) { return _mm256_loadu_pd(p); }
  static void store(double* p, __m256d v) { _mm256_storeu_pd(p, v); }
  static __m256d set1(double s) { return _mm256_set1_pd(s); }
  static __m256d fma(__m256d a, __m256d b, __m256d c) { return _mm256_fmadd_pd(a, b, c); }
};

template <typename T, typename V, typename Ops>
inline void micro_kernel_columns(Index columns, Index kc, const T* A, const T* B, const T* const* src, const T* values,
                                 T* const* dst) {
  switch (columns) {
    case 6: return micro_kernel_avx2<6, V, T, Ops>(kc, A, B, src, values, dst);
    case 5: return micro_kernel_avx2<5, V, T, Ops>(kc, A, B, src, values, dst);
    case 4: return micro_kernel_avx2<4, V, T, Ops>(kc, A, B, src, values, dst);
    case 3: return micro_kernel_avx2<3, V, T, Ops>(kc, A, B, src, values, dst);
    case 2: return micro_kernel_avx2<2, V, T, Ops>(kc, A, B, src, values, dst);
    default: return micro_kernel_avx2<1, V, T, Ops>(kc, A, B, src, values, dst);
  }
}

inline void micro_kernel(Index columns, Index kc, const float* A, const float* B, const float* const* src,
                         const float* values, float* const* dst) {
  micro_kernel_columns<float, __m256, OpsFloat>(columns, kc, A, B, src, values, dst);
}
inline void micro_kernel(Index columns, Index kc, const double* A, const double* B, const double* const* src,
                         const double* values, double* const* dst) {
  micro_kernel_columns<double, __m256d, OpsDouble>(columns, kc, A, B, src, values, dst);
}
#endif

template <typename T>
inline void micro_kernel(Index /*columns*/, Index kc, const T* A, const T* B, const T* const* src, const T* values,
                         T* const* dst) {
  micro_kernel_portable(kc, A, B, src, values, dst);  // computes all NR columns; dst has NR valid pointers
}

inline Index round_up(Index value, Index multiple) { return (value + multiple - 1) / multiple * multiple; }

/// Splits `depth` into passes of at most `kc`, all of equal size but the last.
inline Index pass_depth(Index depth, Index kc) {
  const Index passes = std::max<Index>(1, (depth + kc - 1) / std::max<Index>(1, kc));
  return std::max<Index>(1, (depth + passes - 1) / passes);
}

/// Packs B's columns [c0, c0 + w) for the segment's whole depth: pass by pass, NR-column panels,
/// k-major inside a panel, zero columns past w. Converts S to T here, one value at a time.
template <typename T, typename S>
void pack_b(const GemmArguments<T, S>& a, const Segment& seg, Index c0, Index w, Index kc, T* packed) {
  constexpr Index NR = MicroTile<T>::nr;
  const Index wp = round_up(w, NR);
  for (Index k0 = 0; k0 < seg.depth; k0 += kc) {
    const Index kn = std::min(kc, seg.depth - k0);
    T* pass = packed + k0 * wp;
    for (Index j0 = 0; j0 < wp; j0 += NR) {
      T* panel = pass + j0 * kn;
      for (Index j = 0; j < NR; ++j) {
        if (j0 + j < w) {
          const S* column = a.b + (c0 + j0 + j) * a.ldb + k0;
          for (Index k = 0; k < kn; ++k) panel[k * NR + j] = static_cast<T>(column[k]);
        } else {
          for (Index k = 0; k < kn; ++k) panel[k * NR + j] = T(0);
        }
      }
    }
  }
}

/// Packs rows [r0, r0 + m) of X's channels [k0, k0 + kn) into MR-row panels, k-major inside a
/// panel, zero rows past m: the gather of X[:, rest] happens here, MR contiguous values at a time.
template <typename T, typename S>
void pack_a(const GemmArguments<T, S>& a, const Segment& seg, Index r0, Index m, Index k0, Index kn, T* packed) {
  constexpr Index MR = MicroTile<T>::mr;
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

/// Part of one segment inside a column block.
struct Piece {
  Index segment, c0, w;
};

/// A task's columns: whole segments or parts of one, about nc columns in all, so that a row
/// tile of X stays in L2 while every piece of the block uses it.
struct Block {
  std::vector<Piece> pieces;
  Index packed_size = 0;  // packed B for all pieces
};

struct Task {
  Index block, r0, r1;  // rows [r0, r1) of one block
};

/// Rows [t.r0, t.r1) of one block; packed_b holds the block's B, pieces one after the other.
template <typename T, typename S>
void run_task(const GemmArguments<T, S>& a, const Block& block, const Task& t, const Blocking& blk, const T* packed_b,
              T* packed_a) {
  constexpr Index MR = MicroTile<T>::mr, NR = MicroTile<T>::nr;
  const Index mc = round_up(std::max<Index>(1, blk.mc), MR);
  const auto out_column = [&](Index c) { return a.out + (a.out_columns ? a.out_columns[c] : c) * a.ldo; };
  T edge[MR * NR];  // a partial micro-tile computes here and copies its valid part out
  for (Index r = t.r0; r < t.r1; r += mc) {
    const Index m = std::min(mc, t.r1 - r);
    Index packed_segment = -1, packed_k0 = -1;  // what packed_a holds for these rows
    const T* b_piece = packed_b;
    for (const Piece& piece : block.pieces) {
      const Segment& seg = a.segments[static_cast<std::size_t>(piece.segment)];
      const Index kc = pass_depth(seg.depth, blk.kc), wp = round_up(piece.w, NR);
      for (Index k0 = 0; k0 < std::max<Index>(seg.depth, 1); k0 += kc) {
        const Index kn = std::min(kc, seg.depth - k0);
        const bool first = k0 == 0;
        if (packed_segment != piece.segment || packed_k0 != k0) {
          pack_a(a, seg, r, m, k0, kn, packed_a);
          packed_segment = piece.segment, packed_k0 = k0;
        }
        const T* pass = b_piece + k0 * wp;
        for (Index j0 = 0; j0 < piece.w; j0 += NR) {
          const Index nj = std::min(NR, piece.w - j0);
          const Index c = piece.c0 + j0;  // first B column of the micro-panel
          const T* panel_b = pass + j0 * kn;
          for (Index i0 = 0; i0 < m; i0 += MR) {
            const Index mi = std::min(MR, m - i0), row = r + i0;
            const T* src[NR];
            T* dst[NR];
            T values[NR];
            bool from_values = false;
            for (Index j = 0; j < nj; ++j) {
              dst[j] = out_column(c + j) + row;
              if (!first) {
                src[j] = dst[j];
              } else if (a.init_channels) {
                src[j] = a.x + a.init_channels[c + j] * a.ldx + row;
              } else {
                from_values = true;
                values[j] = a.init_values ? a.init_values[c + j] : T(0);
              }
            }
            if (mi == MR && (nj == NR || MicroTile<T>::any_width)) {
              micro_kernel(nj, kn, packed_a + i0 * kn, panel_b, from_values ? nullptr : src, values, dst);
              continue;
            }
            T* local[NR];  // zero-padded copy of the tile's start, all NR columns computed
            for (Index j = 0; j < NR; ++j) {
              local[j] = edge + j * MR;
              for (Index i = 0; i < MR; ++i)
                local[j][i] = i < mi && j < nj ? (from_values ? values[j] : src[j][i]) : T(0);
            }
            micro_kernel(NR, kn, packed_a + i0 * kn, panel_b, local, static_cast<const T*>(nullptr), local);
            for (Index j = 0; j < nj; ++j) std::copy(local[j], local[j] + mi, dst[j]);
          }
        }
      }
      b_piece += std::max<Index>(seg.depth, 1) * wp;
    }
  }
}

/// Packs B for every piece of a block, one after the other (see pack_b).
template <typename T, typename S>
void pack_block(const GemmArguments<T, S>& a, const Block& block, const Blocking& blk, T* packed) {
  constexpr Index NR = MicroTile<T>::nr;
  for (const Piece& piece : block.pieces) {
    const Segment& seg = a.segments[static_cast<std::size_t>(piece.segment)];
    pack_b(a, seg, piece.c0, piece.w, pass_depth(seg.depth, blk.kc), packed);
    packed += std::max<Index>(seg.depth, 1) * round_up(piece.w, NR);
  }
}

/// The pieces of columns [from, to) of the concatenated segments, grouped into blocks of at most
/// nc columns: a segment that fits is not split, a wider one is cut into equal blocks.
inline std::vector<Block> make_blocks(const std::vector<Segment>& segments, Index from, Index to, Index nc, Index nr) {
  std::vector<Block> blocks;
  Index block_width = nc, start = 0;  // start: the first column of the current segment
  for (std::size_t s = 0; s < segments.size(); ++s) {
    const Segment& seg = segments[s];
    const Index lo = std::max(from, start), hi = std::min(to, start + seg.width);
    start += seg.width;
    if (lo >= hi) continue;
    const Index width = hi - lo, parts = (width + nc - 1) / nc;
    const Index part = round_up((width + parts - 1) / parts, nr);
    for (Index c = lo; c < hi; c += part) {
      const Index w = std::min(part, hi - c);
      if (block_width + w > nc) blocks.emplace_back(), block_width = 0;
      const Index c0 = seg.first_column + (c - (start - seg.width));
      blocks.back().pieces.push_back({static_cast<Index>(s), c0, w});
      blocks.back().packed_size += std::max<Index>(seg.depth, 1) * round_up(w, nr);
      block_width += w;
    }
  }
  return blocks;
}

/// dst[0, n) = src[0, n) converted. bfloat16 → float is the upper half of the float's bits:
/// written as integer shifts so that the compiler vectorises it (the scalar conversion does not).
template <typename S, typename T>
void convert_column(const S* src, Index n, T* dst) {
  if constexpr (std::is_same_v<S, Eigen::bfloat16> && std::is_same_v<T, float>) {
    for (Index k = 0; k < n; ++k) {
      const std::uint32_t bits = std::uint32_t(src[k].value) << 16;
      std::memcpy(dst + k, &bits, sizeof(float));
    }
  } else {
    for (Index k = 0; k < n; ++k) dst[k] = static_cast<T>(src[k]);
  }
}

/// Rows at or below which gemm() takes the unpacked path below (decoding: one token per step,
/// a few with speculative drafts).
inline constexpr Index skinny_rows = 4;

/// The GEMM for a few rows, where packing would cost more than it saves: packing B reads and
/// writes all of it to be read once more, and an MR-row micro-tile would compute MR/L times the
/// work. Here every output value is one dot product of a gathered row of X with a column of B
/// read where it lies (converted from S on the fly, never copied), so B streams through once:
/// the bandwidth bound that one token's projection has. Columns are shared among the threads.
/// `threads` ≥ 1.
template <typename T, typename S>
void gemm_skinny(const GemmArguments<T, S>& a, Index total, int threads) {
  using Vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;
  const Index L = a.rows;
  // X's rows gathered per segment, each row contiguous over the segment's channels; and for
  // every column of the concatenated segments, its segment and column of B.
  std::vector<Index> offsets, segment_of(static_cast<std::size_t>(total)), column_of(static_cast<std::size_t>(total));
  Index gathered_size = 0, g = 0;
  for (std::size_t s = 0; s < a.segments.size(); ++s) {
    offsets.push_back(gathered_size);
    gathered_size += L * a.segments[s].depth;
    for (Index j = 0; j < a.segments[s].width; ++j, ++g) {
      segment_of[static_cast<std::size_t>(g)] = static_cast<Index>(s);
      column_of[static_cast<std::size_t>(g)] = a.segments[s].first_column + j;
    }
  }
  std::vector<T> gathered(static_cast<std::size_t>(std::max<Index>(1, gathered_size)));
  for (std::size_t s = 0; s < a.segments.size(); ++s) {
    const Segment& seg = a.segments[s];
    for (Index i = 0; i < L; ++i)
      for (Index k = 0; k < seg.depth; ++k) gathered[static_cast<std::size_t>(offsets[s] + i * seg.depth + k)] = a.x[seg.channels[k] * a.ldx + i];
  }
  Index work = 0, max_depth = 1;
  for (const Segment& seg : a.segments) {
    work += L * seg.depth * seg.width;
    max_depth = std::max(max_depth, seg.depth);
  }
  // A narrow B's column is converted once into its thread's buffer, then read by every row.
  constexpr bool convert = !std::is_same_v<S, T>;
  std::vector<T> columns(convert ? static_cast<std::size_t>(max_depth * std::max(1, threads)) : 0);
  (void)threads;
  (void)work;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (work >= (Index(1) << 16))
#endif
  for (Index col = 0; col < total; ++col) {
    const std::size_t s = static_cast<std::size_t>(segment_of[static_cast<std::size_t>(col)]);
    const Segment& seg = a.segments[s];
    const Index c = column_of[static_cast<std::size_t>(col)];
    const S* source = a.b + c * a.ldb;
    const T* b = nullptr;
    if constexpr (convert) {
#ifdef _OPENMP
      T* buffer = columns.data() + omp_get_thread_num() * max_depth;
#else
      T* buffer = columns.data();
#endif
      convert_column(source, seg.depth, buffer);
      b = buffer;
    } else {
      b = source;
    }
    const Eigen::Map<const Vector> column(b, seg.depth);
    T* out = a.out + (a.out_columns ? a.out_columns[c] : c) * a.ldo;
    for (Index i = 0; i < L; ++i) {
      const T start = a.init_channels ? a.x[a.init_channels[c] * a.ldx + i] : a.init_values ? a.init_values[c] : T(0);
      const Eigen::Map<const Vector> row(gathered.data() + offsets[s] + i * seg.depth, seg.depth);
      out[i] = seg.depth ? T(start + row.dot(column)) : start;
    }
  }
}

}  // namespace detail

/// Runs the GEMM on up to `threads` OpenMP threads (0: omp_get_max_threads(), which honours
/// OMP_NUM_THREADS; 1 inside a parallel region). Preconditions (asserted where cheap): pointers
/// and leading dimensions cover every index the segments, channel and column lists name.
///
/// Work is split as a grid: the columns (all segments side by side) into `column_groups` equal
/// ranges, cut anywhere, and the rows into threads / column_groups equal ranges only when the
/// columns are too narrow to give every thread four micro-panels. A thread packs each B block of
/// its range once, so B is packed once in all, and every thread gets the same share of work.
/// At most detail::skinny_rows rows (decoding) take an unpacked path that streams B once.
template <typename T, typename S>
void gemm(const GemmArguments<T, S>& a, const Blocking& blk = {}, int threads = 0) {
  constexpr Index MR = MicroTile<T>::mr, NR = MicroTile<T>::nr;
  eigen_assert(a.rows >= 0 && a.ldx >= a.rows && a.ldo >= a.rows && "bd::kernel::gemm: leading dimensions");
  Index total = 0, max_kc = 1;
  for (const auto& seg : a.segments) {
    total += seg.width;
    max_kc = std::max(max_kc, detail::pass_depth(seg.depth, blk.kc));
  }
  if (a.rows == 0 || total == 0) return;
#ifdef _OPENMP
  if (threads <= 0) threads = omp_in_parallel() ? 1 : omp_get_max_threads();
#else
  threads = 1;
#endif
  if (a.rows <= detail::skinny_rows) return detail::gemm_skinny(a, total, threads);
  const Index row_units = (a.rows + MR - 1) / MR;
  Index column_groups = std::max(1, threads);
  while (column_groups > 1 && (total / column_groups < 4 * NR || threads % column_groups)) --column_groups;
  const Index row_groups = std::max<Index>(1, std::min<Index>(threads / column_groups, row_units));
  const Index group_width = detail::round_up((total + column_groups - 1) / column_groups, NR);
  const Index group_rows = (row_units + row_groups - 1) / row_groups * MR;
  const Index nc = detail::round_up(std::max<Index>(1, blk.nc), NR);
  std::vector<std::vector<detail::Block>> column_blocks;
  Index b_size = 1;
  for (Index g = 0; g < column_groups; ++g) {
    column_blocks.push_back(detail::make_blocks(a.segments, g * group_width, std::min(total, (g + 1) * group_width), nc, NR));
    for (const auto& block : column_blocks.back()) b_size = std::max(b_size, block.packed_size);
  }
  const Index workers = column_groups * row_groups;
  const Index a_size = detail::round_up(std::max<Index>(1, blk.mc), MR) * max_kc;
  std::vector<T> buffers(static_cast<std::size_t>((b_size + a_size) * workers));
#ifdef _OPENMP
#pragma omp parallel num_threads(static_cast<int>(workers))
#endif
  {
#ifdef _OPENMP
    const Index me = omp_get_thread_num(), team = omp_get_num_threads();
#else
    const Index me = 0, team = 1;
#endif
    for (Index w = me; w < workers; w += team) {  // a smaller team than asked for takes several shares
      T* packed_b = buffers.data() + w * (b_size + a_size);
      T* packed_a = packed_b + b_size;
      const Index r0 = (w / column_groups) * group_rows;
      const detail::Task rows{0, r0, std::min(a.rows, r0 + group_rows)};
      if (rows.r0 >= rows.r1) continue;
      for (const detail::Block& block : column_blocks[static_cast<std::size_t>(w % column_groups)]) {
        detail::pack_block(a, block, blk, packed_b);
        detail::run_task(a, block, rows, blk, packed_b, packed_a);
      }
    }
  }
}

}  // namespace bd::kernel
