// bd/kernel/skinny.hpp — the GEMM for a few rows (decoding: one token per step, a few with
// speculative drafts), where packing would cost more than it saves: packing B reads and writes
// all of it to be read once more, and an MR-row micro-tile would compute MR/L times the work.
// Here every output value is one dot product of a gathered row of X with a column of B read
// where it lies (a narrow B converted once per column into a per-thread buffer), so B streams
// through once: the bandwidth bound that one token's projection has. The kernel takes a run of
// neighbouring columns per call (skinny_group), walking B in memory order; runs are shared
// among the threads. A row-major B (a weight read transposed in place: absorbed decoding's maps
// into the latent, one per head) is read a run of a group's columns per row of B, each row in
// order, by the kernel's column_scores — the few-row attention's scores, which is the same
// product with K's channels for B's rows.
#pragma once

#include <algorithm>

#include "bd/base/workspace.hpp"
#include "bd/kernel/arguments.hpp"
#include "bd/kernel/context.hpp"
#include "bd/kernel/few_row_kernel.hpp"
#include "bd/kernel/pack.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace bd::kernel::detail {

/// Rows at or below which gemm() takes this path: the few-row kernels hold up to four rows'
/// sums in registers (a choice of summation order, so the shapes decide it, not the tuning).
inline constexpr Index skinny_rows = 4;
/// Columns per call at most (Tuning::skinny_group and skinny_run are clamped to it): the size of
/// a call's array of dot products.
inline constexpr Index skinny_max_width = 512;

/// A unit of gemm_skinny's work: up to `width` neighbouring columns of one segment.
struct SkinnyGroup {
  Index segment = 0, column = 0, count = 0;
};

/// gemm_skinny's scratch, kept in the caller's Workspace (one per thread) so that a decoded token,
/// whose every projection comes here, allocates nothing once its shapes have been seen.
template <typename T>
struct SkinnyScratch {
  ScratchBuffer<Index> offsets;       ///< where each segment's gathered rows start
  ScratchBuffer<SkinnyGroup> groups;  ///< the work
  ScratchBuffer<T> gathered;          ///< X's rows per segment
  ScratchBuffer<T> converted;         ///< a narrow B's runs, one buffer per thread
};

/// out(:, c) = start + dots for a group's columns: row i of its column j at dots[j·column_step +
/// i·row_step]; start the output itself (accumulate), an input channel, a value or zero.
template <typename T, typename S>
void write_dots(const GemmArguments<T, S>& a, const SkinnyGroup& group, const T* dots, Index column_step, Index row_step) {
  for (Index j = 0; j < group.count; ++j) {
    const Index c = group.column + j;
    T* out = a.out + (a.out_columns ? a.out_columns[c] : c) * a.ldo;
    for (Index i = 0; i < a.rows; ++i) {
      const T start = a.accumulate       ? out[i]
                      : a.init_channels  ? a.x[a.init_channels[c] * a.ldx + i]
                      : a.init_values    ? a.init_values[c]
                                         : T(0);
      out[i] = start + dots[j * column_step + i * row_step];
    }
  }
}

/// Compiled once per (T, S) and run on the active kernel's few-row routines (few_row_kernel.hpp).
/// The work comes in runs of neighbouring columns, Tuning::skinny_group (enough to amortise the
/// call, few enough to share among threads); a row-major B (absorbed decoding's maps into the
/// latent, one per head, their callers sharing the heads among the threads) in runs of
/// Tuning::skinny_run of each of B's rows, so that one call reads a head's map row after row in
/// memory order.
template <typename T, typename S>
void gemm_skinny(const GemmArguments<T, S>& a, int threads, const FewRowKernel<T>& kernel, const Context& context,
                 SkinnyScratch<T>& scratch) {
  const bool by_rows = a.b_row_major;
  constexpr Index max_width = skinny_max_width;
  const Index width = std::min(max_width, by_rows ? context.tuning.skinny_run : context.tuning.skinny_group);
  const Index row_walk = context.tuning.row_walk, ahead = context.tuning.stream_prefetch / Index(sizeof(T));
  // A bfloat16 B read in place is asked for as far ahead in bytes as the few-row attention's
  // streams: its loads widen as they go, and the hardware prefetcher alone left it well below a
  // float B's rate (docs/benchmarks.md, "bf16 weights prefetched"); a float B is not (see
  // micro_kernel_simd.inc).
  const Index bf16_ahead = context.tuning.stream_prefetch / Index(sizeof(Eigen::bfloat16));
  const Index L = a.rows;
  // X's rows gathered per segment, each row contiguous over the segment's channels; and the
  // work as groups of up to `width` neighbouring columns of one segment.
  Index count = 0;
  for (const Segment& seg : a.segments) count += (seg.width + width - 1) / width;
  Index* const offsets = scratch.offsets.reserve(std::max<std::size_t>(1, a.segments.size()));
  SkinnyGroup* const groups = scratch.groups.reserve(static_cast<std::size_t>(std::max<Index>(1, count)));
  Index gathered_size = 0, work = 0, max_depth = 1, g = 0;
  for (std::size_t s = 0; s < a.segments.size(); ++s) {
    const Segment& seg = a.segments[s];
    offsets[s] = gathered_size;
    gathered_size += L * seg.depth;
    work += L * seg.depth * seg.width;
    max_depth = std::max(max_depth, seg.depth);
    for (Index j = 0; j < seg.width; j += width)
      groups[g++] = {static_cast<Index>(s), seg.first_column + j, std::min(width, seg.width - j)};
  }
  // Gathered row by row (i·depth + k) for dot_columns, channel by channel (k·L + i) for
  // column_scores.
  T* const gathered = scratch.gathered.reserve(static_cast<std::size_t>(std::max<Index>(1, gathered_size)));
  // bf16 compute (T float, B in float or bfloat16: gemm() checked): X's values and B's rounded to
  // bfloat16 as they are gathered and converted, then summed in float.
  constexpr bool bf16_possible = std::is_same_v<T, float> && (std::is_same_v<S, float> || std::is_same_v<S, Eigen::bfloat16>);
  const bool bf16 = bf16_possible && a.compute == Compute::BF16;
  for (std::size_t s = 0; s < a.segments.size(); ++s) {
    const Segment& seg = a.segments[s];
    for (Index i = 0; i < L; ++i)
      for (Index k = 0; k < seg.depth; ++k) {
        T value = a.x[seg.channels[k] * a.ldx + i];
        if constexpr (bf16_possible) value = bf16 ? bf16_value(value) : value;
        gathered[offsets[s] + (by_rows ? k * L + i : i * seg.depth + k)] = value;
      }
  }
  // A narrow B's columns (rows' runs), or any B's rounded for bf16 compute, are converted once
  // into their thread's buffer, then read by every row of X; except a bfloat16 B's columns under
  // float arithmetic, read where they lie and widened exactly as they load (the sums of a
  // converted copy, from half the bytes: a group's copy would not stay in L2 at decoding's depths).
  constexpr bool bf16_in_place = std::is_same_v<T, float> && std::is_same_v<S, Eigen::bfloat16>;
  const bool convert = (!std::is_same_v<S, T> || bf16) && !(bf16_in_place && !by_rows);
  const auto convert_run = [rounded = bf16](const S* from, Index n, T* to) {
    (void)rounded;  // read only where B is float
    if constexpr (bf16_possible && std::is_same_v<S, T>) {  // a float B rounded; a bfloat16 B widens exactly
      if (rounded) {
        for (Index k = 0; k < n; ++k) to[k] = bf16_value(from[k]);
        return;
      }
    }
    convert_column(from, n, to);
  };
  const auto buffer_size = static_cast<std::size_t>(width * max_depth * std::max(1, threads));
  T* const buffers = convert ? scratch.converted.reserve(buffer_size) : nullptr;
  (void)threads;
  (void)work;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (work >= (Index(1) << 16))
#endif
  for (Index u = 0; u < count; ++u) {
    const SkinnyGroup& group = groups[u];
    const Segment& seg = a.segments[static_cast<std::size_t>(group.segment)];
    // B(k, c) for the group's columns: b[c·ldb + k] (column-major) or b[k·ldb + c] (row-major).
    const S* source = a.b + (by_rows ? group.column : group.column * a.ldb);
    // dots: row i of column j at j·skinny_rows + i (dot_columns) or i·width + j (column_scores).
    T dots[max_width * skinny_rows];
    const T* rows = gathered + offsets[group.segment];
    const T* b = nullptr;
    Index ldb = a.ldb;
    if (!convert) {
      if constexpr (std::is_same_v<S, T>) b = source;  // else a bfloat16 B, read in place below
    } else {
#ifdef _OPENMP
      T* buffer = buffers + omp_get_thread_num() * width * max_depth;
#else
      T* buffer = buffers;
#endif
      if (by_rows) {
        for (Index k = 0; k < seg.depth; ++k) convert_run(source + k * a.ldb, group.count, buffer + k * width);
        ldb = width;
      } else {
        for (Index j = 0; j < group.count; ++j) convert_run(source + j * a.ldb, seg.depth, buffer + j * max_depth);
        ldb = max_depth;
      }
      b = buffer;
    }
    if (!by_rows) {
      if constexpr (bf16_in_place)
        kernel.dot_columns_bf16(L, rows, seg.depth, source, a.ldb, group.count, dots, row_walk, bf16_ahead);
      else kernel.dot_columns(L, rows, seg.depth, b, ldb, group.count, dots, row_walk);
    } else if (seg.depth > 0) {
      kernel.column_scores(L, group.count, seg.depth, b, ldb, rows, L, dots, width, true, ahead);
    } else {
      std::fill(dots, dots + width * skinny_rows, T(0));
    }
    write_dots(a, group, dots, by_rows ? 1 : skinny_rows, by_rows ? width : 1);
  }
}

}  // namespace bd::kernel::detail

namespace bd::kernel {

/// Products with at most this many rows take the skinny path (decoding: a few tokens at a time).
inline constexpr Index skinny_rows = detail::skinny_rows;

/// Whether a loop of per-head products with `rows` rows each (absorbed decoding's maps into and
/// out of the latent, BD's adjoint) shares the heads among the threads, each head's product one
/// thread's pass over memory — a few rows, the skinny path, bound by reading the weights — rather
/// than every thread working inside each head's product (more rows: each product a packed GEMM).
inline bool heads_across_threads(Index rows) { return rows <= skinny_rows; }

}  // namespace bd::kernel
