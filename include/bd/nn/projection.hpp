// bd/nn/projection.hpp — the BD projection that replaces a key or value projection:
//
//     out[:, h·d:(h+1)·d] = z[:, S_h] + z[:, R_h]·C_h        for every head h
//
// S_h are head h's basis channels (one shared window, or a pivoted set per head), R_h the
// others in ascending order, C = [C_1 … C_n] ((d_in − d) × n·d).
//
// It runs on bd::kernel::gemm (kernel/gemm.hpp, runtime-dispatched micro-kernels), which makes
// this one fused pass: the accumulators of each micro-tile start from the basis channels
// z[:, S_h] (no fill pass over the output, which would write and read all of it once more),
// R_h is gathered while z's row tile is packed
// (with a window at offset o that is z[:, 0:o] and z[:, o+d:], nothing is copied beyond the
// packing every GEMM does), and half/bfloat16 coefficients are converted panel by panel. A
// shared window is one segment of n·d columns; per-head pivoted bases are one segment per
// head, each packing its own rest channels of the row tile while the tile is in cache.
#pragma once

#include <algorithm>
#include <type_traits>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "bd/base/code_size.hpp"
#include "bd/core/basis_selection.hpp"
#include "bd/core/decomposition.hpp"
#include "bd/core/parallel.hpp"
#include "bd/kernel/gemm.hpp"
#include "bd/kernel/matmul.hpp"
#include "bd/nn/types.hpp"

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
  /// Refuses a head whose channels are not distinct, ascending and in [0, input_dim), or whose
  /// size differs from the first head's (stored indices are read from files).
  BD_COLD static HeadIndices from_basis(std::vector<std::vector<Index>> basis, Index input_dim) {
    if (basis.empty() || basis.front().empty()) throw ShapeError("head indices: no heads, or an empty basis");
    for (std::size_t h = 0; h < basis.size(); ++h) {
      const auto& b = basis[h];
      if (b.size() != basis.front().size())
        throw ShapeError(bd::detail::message("head indices: head ", h, " has ", b.size(), " channels, head 0 has ",
                                             basis.front().size()));
      for (std::size_t i = 0; i < b.size(); ++i)
        if (b[i] < 0 || b[i] >= input_dim || (i > 0 && b[i] <= b[i - 1]))
          throw RangeError(bd::detail::message("head indices: head ", h, " must hold distinct, ascending channels in [0, ",
                                               input_dim, "); found ", b[i], " at position ", i));
    }
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

  /// In words: "rows a..b" for a shared window (the input channels every head's basis takes),
  /// "per-head pivoted" when each head has its own channels.
  std::string describe() const {
    if (shared) return bd::detail::message("rows ", offset, "..", offset + head_dim - 1);
    return "per-head pivoted";
  }
};

namespace detail {
/// bd_project_into's index lists and segments (the calling thread's, in its Workspace).
struct ProjectionScratch {
  ScratchBuffer<Index> indices;                  ///< each output column's basis channel, then the heads' rest channels
  ScratchBuffer<bd::kernel::Segment> segments;   ///< one per head
};

/// out = [z[:, h·step + S_h] + z[:, h·step + R_h]·C_h]_h: step 0 for one input every head reads
/// (a key or value projection), step d_in for heads that read their own d_in-wide blocks of z
/// (absorbed decoding's per-head latent outputs).
template <typename A, typename S>
void bd_project_into(const ConstRef<A>& z, Index step, const HeadIndices& idx, const StoredMatrix<S>& C,
                     Eigen::Ref<MatrixA<A>> out, const bd::kernel::Blocking& blocking, Workspace& ws,
                     bd::kernel::Compute compute) {
  const Index d = idx.head_dim, n = idx.heads(), d_in = idx.input_dim, r = d_in - d;
  const Index z_cols = step ? n * step : d_in;
  if (z.cols() != z_cols || C.rows() != r || C.cols() != n * d || out.rows() != z.rows() || out.cols() != n * d)
    throw ShapeError(bd::detail::message("bd_project_into: z is ", z.rows(), "x", z.cols(), ", C ", C.rows(), "x", C.cols(),
                                         " and out ", out.rows(), "x", out.cols(), "; expected z with ",
                                         step ? "heads·input_dim = " : "input_dim = ", z_cols,
                                         " columns, C (input_dim − head_dim = ", r, ") x (heads·head_dim = ", n * d,
                                         ") and out ", z.rows(), "x", n * d));
  auto head = [&](const std::vector<std::vector<Index>>& v, Index h) -> const std::vector<Index>& {
    return v[static_cast<std::size_t>(idx.shared ? 0 : h)];
  };
  // The basis channel each output column starts from; with per-head inputs, each head's rest
  // channels moved to its block. These lists and the per-head segments live in the calling
  // thread's Workspace: a decoded token's projection allocates nothing for them.
  ProjectionScratch& scratch = ws.local<ProjectionScratch>();
  Index* const init = scratch.indices.reserve(static_cast<std::size_t>(n * d + (step ? n * r : 0)));
  Index* const channels = init + n * d;
  for (Index h = 0; h < n; ++h) {
    for (Index j = 0; j < d; ++j) init[h * d + j] = h * step + head(idx.basis, h)[static_cast<std::size_t>(j)];
    if (step)
      for (Index k = 0; k < r; ++k) channels[h * r + k] = h * step + head(idx.rest, h)[static_cast<std::size_t>(k)];
  }
  bd::kernel::GemmArguments<A, S> args;
  args.rows = z.rows();
  args.x = z.data();
  args.ldx = z.outerStride();
  args.b = C.data();
  args.ldb = C.outerStride();
  args.out = out.data();
  args.ldo = out.outerStride();
  args.init_channels = init;
  if (idx.shared && !step) {
    args.segments.push_back({idx.rest.front().data(), r, 0, n * d});
  } else {  // one segment per head
    bd::kernel::Segment* const segments = scratch.segments.reserve(static_cast<std::size_t>(n));
    for (Index h = 0; h < n; ++h)
      segments[h] = {step ? channels + h * r : idx.rest[static_cast<std::size_t>(h)].data(), r, h * d, d};
    args.segments.view(segments, static_cast<std::size_t>(n));
  }
  args.compute = compute;
  bd::kernel::gemm(args, blocking, 0, ws);
}
}  // namespace detail

/// out (L × n·d) = [z[:, S_h] + z[:, R_h]·C_h]_h, fused and blocked (see the file comment).
/// Runs on omp_get_max_threads() threads (OMP_NUM_THREADS), one inside a parallel region.
/// `compute` bf16: z[:, R_h] and C rounded to bfloat16 as they are packed, z[:, S_h] added as it is.
template <typename A, typename S>
void bd_project_into(const ConstRef<A>& z, const HeadIndices& idx, const StoredMatrix<S>& C,
                     Eigen::Ref<MatrixA<A>> out, const bd::kernel::Blocking& blocking = {},
                     Workspace& ws = default_workspace(), bd::kernel::Compute compute = bd::kernel::Compute::F32) {
  detail::bd_project_into<A, S>(z, 0, idx, C, out, blocking, ws, compute);
}

/// The same with an input per head: z is L × n·d_in and head h reads its own block
/// z_h = z[:, h·d_in:(h+1)·d_in], out_h = z_h[:, S_h] + z_h[:, R_h]·C_h (absorbed decoding's
/// O_h = Õ_h[S_h] + Õ_h[R_h]·C_h, every head in one product).
template <typename A, typename S>
void bd_project_heads_into(const ConstRef<A>& z, const HeadIndices& idx, const StoredMatrix<S>& C,
                           Eigen::Ref<MatrixA<A>> out, const bd::kernel::Blocking& blocking = {},
                           Workspace& ws = default_workspace(), bd::kernel::Compute compute = bd::kernel::Compute::F32) {
  detail::bd_project_into<A, S>(z, idx.input_dim, idx, C, out, blocking, ws, compute);
}

/// The adjoint per head, out_h (L × d_in) with out_h[:, S_h] = q_h and out_h[:, R_h] = q_h·C_hᵀ
/// for q = [q_h]_h (L × n_q·d), so that out_h·zᵀ = q_h·(z[:, S_h] + z[:, R_h]·C_h)ᵀ: absorbed
/// decoding's queries against a latent. Query head h reads head h·heads/n_q of idx and C (query
/// heads sharing a head of K'); per head one product with C_h read transposed in place, its
/// columns written to R_h's places.
template <typename A, typename S>
MatrixA<A> bd_adjoint_heads(const ConstRef<A>& q, Index n_q, const HeadIndices& idx, const StoredMatrix<S>& C,
                            Workspace& ws = default_workspace(), bd::kernel::Compute compute = bd::kernel::Compute::F32) {
  const Index L = q.rows(), d = idx.head_dim, d_in = idx.input_dim, per = n_q / idx.heads();
  if (q.cols() != n_q * d || n_q % idx.heads() || C.rows() != d_in - d || C.cols() != idx.heads() * d)
    throw ShapeError(bd::detail::message("bd_adjoint_heads: q is ", L, "x", q.cols(), " and C ", C.rows(), "x", C.cols(),
                                         " for ", n_q, " query heads over ", idx.heads(), " heads of ", d, " channels in ", d_in));
  MatrixA<A> out(L, n_q * d_in);
  // Every head's output columns R_h and its channels of q, listed once for all heads: a head's
  // product then allocates nothing (absorbed decoding runs one per head for every token).
  const Index r = d_in - d;
  std::vector<Index> columns(static_cast<std::size_t>(n_q * r));
  for (Index h = 0; h < n_q; ++h) {
    const auto& rest = idx.rest[static_cast<std::size_t>(idx.shared ? 0 : h / per)];
    for (Index j = 0; j < r; ++j) columns[static_cast<std::size_t>(h * r + j)] = h * d_in + rest[static_cast<std::size_t>(j)];
  }
  const Index* const channels = bd::kernel::identity_channels(n_q * d, ws);
  // Decoding's few rows take the heads in parallel (heads_across_threads).
  bd::detail::parallel_for(
      n_q,
      [&](Index h) {
        const Index k = h / per;  // the head of idx (and of C) query head h reads
        const auto& basis = idx.basis[static_cast<std::size_t>(idx.shared ? 0 : k)];
        for (std::size_t j = 0; j < basis.size(); ++j) out.col(h * d_in + basis[j]) = q.col(h * d + Index(j));
        bd::kernel::GemmArguments<A, S> args;
        args.rows = L;
        args.x = q.data(), args.ldx = q.outerStride();
        args.b = C.data() + k * d * C.outerStride(), args.ldb = C.outerStride(), args.b_row_major = true;
        args.out = out.data(), args.ldo = out.outerStride(), args.out_columns = columns.data() + h * r;
        args.segments.push_back({channels + h * d, d, 0, r});
        args.compute = compute;
        bd::kernel::gemm(args, {}, 0, ws);
      },
      bd::kernel::heads_across_threads(L));
  return out;
}

/// The same, returning a new matrix.
template <typename A, typename S>
MatrixA<A> bd_project(const ConstRef<A>& z, const HeadIndices& idx, const StoredMatrix<S>& C,
                      const bd::kernel::Blocking& blocking = {}, Workspace& ws = default_workspace()) {
  MatrixA<A> out(z.rows(), idx.heads() * idx.head_dim);
  bd_project_into<A, S>(z, idx, C, out, blocking, ws);
  return out;
}

/// The backward of K'_h = z[:, S_h] + z[:, R_h]·C_h (bd_project): given ∂K', returns ∂z and
/// writes ∂C (C's shape):  ∂C_h = z[:, R_h]ᵀ·∂K'_h,  ∂z[:, S_h] += ∂K'_h,  ∂z[:, R_h] += ∂K'_h·C_hᵀ.
/// A shared window's heads read the same z[:, R]: one product each for all of them. A window's
/// R is at most two runs of adjacent channels (before and after it), and each run's products read
/// z and write ∂z in place; per-head pivoted rest channels are gathered and scattered.
template <typename A, typename S>
MatrixA<A> bd_project_backward(const ConstRef<A>& z, const HeadIndices& idx, const StoredMatrix<S>& C,
                               const ConstRef<A>& dK, MatrixA<A>& dC, Workspace& ws = default_workspace()) {
  static_assert(std::is_same_v<A, S>, "bd_project_backward: C stored in the arithmetic type");
  const Index n = idx.heads(), d = idx.head_dim, L = z.rows();
  if (z.cols() != idx.input_dim || dK.rows() != L || dK.cols() != n * d || C.rows() != idx.input_dim - d || C.cols() != n * d)
    throw ShapeError("bd_project_backward: z, C and dK do not fit the head indices");
  // A shared window writes every column of ∂z (its rest runs by one product each, its basis
  // channels as Σ_h ∂K'_h): no zeroing first. Pivoted heads overlap, and add into zeros.
  MatrixA<A> dz = idx.shared ? MatrixA<A>(L, idx.input_dim) : MatrixA<A>::Zero(L, idx.input_dim);
  dC.resize(C.rows(), C.cols());
  for (Index h = 0; h < (idx.shared ? 1 : n); ++h) {
    const auto& basis = idx.basis[static_cast<std::size_t>(h)];
    const auto& rest = idx.rest[static_cast<std::size_t>(h)];
    const Index first = idx.shared ? 0 : h, width = idx.shared ? n * d : d;
    auto dK_h = dK.middleCols(first * d, width);
    auto dC_h = dC.middleCols(first * d, width);
    const auto C_h = C.middleCols(first * d, width);
    if (idx.shared) {
      // R = [0, offset) ∪ [offset + d, d_in): row block `at` of C_h and ∂C_h is channel run `from`.
      const Index runs[2][3] = {{0, 0, idx.offset}, {idx.offset, idx.offset + d, idx.input_dim - idx.offset - d}};
      for (const auto& run : runs) {
        const Index at = run[0], from = run[1], count = run[2];
        if (!count) continue;
        auto dC_run = dC_h.middleRows(at, count);
        bd::kernel::matmul_into(z.middleCols(from, count).transpose(), dK_h, dC_run, ws);
        auto dz_run = dz.middleCols(from, count);
        bd::kernel::matmul_into(dK_h, C_h.middleRows(at, count).transpose(), dz_run, ws);
      }
      auto dz_basis = dz.middleCols(idx.offset, d);  // Σ_h ∂K'_h, in head order
      dz_basis = dK_h.leftCols(d);
      for (Index k = 1; k < n; ++k) dz_basis += dK_h.middleCols(k * d, d);
    } else {
      const MatrixA<A> z_rest = z(Eigen::all, rest);
      bd::kernel::matmul_into(z_rest.transpose(), dK_h, dC_h, ws);
      MatrixA<A> dz_rest(L, Index(rest.size()));
      bd::kernel::matmul_into(dK_h, C_h.transpose(), dz_rest, ws);
      dz(Eigen::all, rest) += dz_rest;
      for (Index k = 0; k < d; ++k) dz.col(basis[static_cast<std::size_t>(k)]) += dK_h.col(k);
    }
  }
  return dz;
}

/// The plain Eigen expression the kernel must equal: gather, one GEMM per head, add.
template <typename A, typename S>
MatrixA<A> bd_project_reference(const ConstRef<A>& z, const HeadIndices& idx,
                                const StoredMatrix<S>& C) {
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
