// bd/nn/projection.hpp — the BD projection that replaces a key or value projection:
//
//     out[:, h·d:(h+1)·d] = z[:, S_h] + z[:, R_h]·C_h        for every head h
//
// S_h are head h's basis channels (one shared window, or a pivoted set per head), R_h the
// others in ascending order, C = [C_1 … C_n] ((d_in − d) × n·d).
//
// The kernel is blocked over rows (row_tile) and output columns (column_tile) and fused: each
// output tile is first filled with its heads' basis channels of z, then the GEMM accumulates
// into it while it is still in cache — a separate fill pass over the whole output costs 10–15 %
// (DESIGN.md §4). With a window at offset o, R is two pieces, z[:, 0:o] and z[:, o+d:], so
// the GEMM is two products against the matching rows of C; nothing is copied. Per-head bases
// gather each head's R_h columns of the row tile into a small contiguous buffer first.
// Coefficients stored in half or bfloat16 are converted one column block at a time into a
// per-thread float buffer, never as a whole matrix. Tiles run in parallel under OpenMP.
#pragma once

#include <algorithm>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "bd/core/basis_selection.hpp"
#include "bd/core/decomposition.hpp"
#include "bd/nn/attention_core.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace bd::nn {

/// Which input channels form each head's basis.
struct HeadIndices {
  Index input_dim = 0;  ///< d_in, the width of z
  Index head_dim = 0;   ///< d, the width of each head's output
  bool shared = true;   ///< one contiguous window [offset, offset + d) for every head
  Index offset = 0;
  std::vector<std::vector<Index>> basis, rest;  ///< per head, ascending

  template <typename S>
  static HeadIndices of(const SharedDecomposition<S>& set, Index input_dim) {
    std::vector<std::vector<Index>> basis;
    for (const auto& head : set.heads()) basis.push_back(head.indices());
    return from_basis(std::move(basis), input_dim);
  }

  /// From each head's basis channels; shared when they are one window common to all heads.
  static HeadIndices from_basis(std::vector<std::vector<Index>> basis, Index input_dim) {
    HeadIndices out;
    out.input_dim = input_dim;
    out.head_dim = static_cast<Index>(basis.front().size());
    const auto& first = basis.front();
    const bool window = first.back() - first.front() + 1 == out.head_dim;
    out.shared = window && std::all_of(basis.begin(), basis.end(), [&](const auto& b) { return b == first; });
    out.offset = first.front();
    for (const auto& b : basis) out.rest.push_back(bd::detail::complement(b, input_dim));
    out.basis = std::move(basis);
    return out;
  }

  /// A window at `offset` shared by `heads` heads.
  static HeadIndices window(Index input_dim, Index head_dim, Index offset, Index heads) {
    return from_basis(std::vector<std::vector<Index>>(static_cast<std::size_t>(heads), bd::detail::contiguous(offset, head_dim)),
                      input_dim);
  }

  Index heads() const { return static_cast<Index>(basis.size()); }
};

/// Tile sizes of the fused kernel. A row tile of z (row_tile × d_in floats) and the output tile
/// (row_tile × column_tile) stay in L2 while a C block (d_in × column_tile) streams through.
struct ProjectionTiling {
  Index row_tile = 128;
  Index column_tile = 256;  ///< rounded to whole heads
};

namespace detail {

inline int threads_for(Index tasks) {
#ifdef _OPENMP
  return static_cast<int>(std::max<Index>(1, std::min<Index>(tasks, omp_get_max_threads())));
#else
  (void)tasks;
  return 1;
#endif
}

}  // namespace detail

/// out (L × n·d) = [z[:, S_h] + z[:, R_h]·C_h]_h, fused and blocked (see the file comment).
template <typename A, typename S>
void bd_project_into(const ConstRef<A>& z, const HeadIndices& idx, const Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>& C,
                     Eigen::Ref<MatrixA<A>> out, const ProjectionTiling& tiling = {}) {
  const Index d = idx.head_dim, n = idx.heads(), L = z.rows(), d_in = idx.input_dim;
  eigen_assert(z.cols() == d_in && C.rows() == d_in - d && C.cols() == n * d && out.rows() == L && out.cols() == n * d &&
               "bd_project_into: shapes disagree");
  const Index heads_per_block = std::max<Index>(1, tiling.column_tile / d);
  const Index column_blocks = (n + heads_per_block - 1) / heads_per_block;
  const Index row_tile = std::max<Index>(1, tiling.row_tile);
  const Index row_blocks = (L + row_tile - 1) / row_tile;
  const Index o = idx.offset, right = d_in - o - d;
  // Parallel over column blocks (each converts its C block once) and, when there are fewer
  // blocks than threads, over row tiles too.
  const Index tasks = column_blocks * row_blocks;
#ifdef _OPENMP
#pragma omp parallel num_threads(detail::threads_for(tasks))
#endif
  {
    MatrixA<A> c_buffer, gathered;
    Index converted_block = -1;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (Index t = 0; t < tasks; ++t) {
      const Index cb = t / row_blocks, rb = t % row_blocks;
      const Index h0 = cb * heads_per_block, hn = std::min(heads_per_block, n - h0);
      const Index c0 = h0 * d, w = hn * d;
      const Index r0 = rb * row_tile, rows = std::min(row_tile, L - r0);
      const A* c_data;
      if constexpr (std::is_same_v<A, S>) {
        c_data = C.data() + c0 * C.rows();  // column-major: the block is contiguous
      } else {
        if (converted_block != cb) {  // narrow storage: convert this column block once per thread
          c_buffer = C.middleCols(c0, w).template cast<A>();
          converted_block = cb;
        }
        c_data = c_buffer.data();
      }
      const Eigen::Map<const MatrixA<A>> Cb(c_data, C.rows(), w);
      auto tile = out.block(r0, c0, rows, w);
      if (idx.shared) {
        for (Index h = 0; h < hn; ++h) tile.middleCols(h * d, d) = z.block(r0, o, rows, d);  // the window, broadcast
        if (o > 0) tile.noalias() += z.block(r0, 0, rows, o) * Cb.topRows(o);
        if (right > 0) tile.noalias() += z.block(r0, o + d, rows, right) * Cb.bottomRows(right);
      } else {
        gathered.resize(rows, d_in - d);
        for (Index h = 0; h < hn; ++h) {
          const auto& S_h = idx.basis[static_cast<std::size_t>(h0 + h)];
          const auto& R_h = idx.rest[static_cast<std::size_t>(h0 + h)];
          for (std::size_t k = 0; k < R_h.size(); ++k) gathered.col(static_cast<Index>(k)) = z.block(r0, R_h[k], rows, 1);
          auto head = tile.middleCols(h * d, d);
          for (Index k = 0; k < d; ++k) head.col(k) = z.block(r0, S_h[static_cast<std::size_t>(k)], rows, 1);
          head.noalias() += gathered * Cb.middleCols(h * d, d);
        }
      }
    }
  }
}

/// The same, returning a new matrix.
template <typename A, typename S>
MatrixA<A> bd_project(const ConstRef<A>& z, const HeadIndices& idx, const Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>& C,
                      const ProjectionTiling& tiling = {}) {
  MatrixA<A> out(z.rows(), idx.heads() * idx.head_dim);
  bd_project_into<A, S>(z, idx, C, out, tiling);
  return out;
}

/// The plain Eigen expression the kernel must equal: gather, one GEMM per head, add.
template <typename A, typename S>
MatrixA<A> bd_project_reference(const ConstRef<A>& z, const HeadIndices& idx,
                                const Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>& C) {
  const Index d = idx.head_dim, n = idx.heads();
  MatrixA<A> out(z.rows(), n * d);
  for (Index h = 0; h < n; ++h) {
    const auto& S_h = idx.basis[static_cast<std::size_t>(h)];
    const auto& R_h = idx.rest[static_cast<std::size_t>(h)];
    out.middleCols(h * d, d) = z(Eigen::all, R_h) * C.middleCols(h * d, d).template cast<A>() + z(Eigen::all, S_h);
  }
  return out;
}

}  // namespace bd::nn
