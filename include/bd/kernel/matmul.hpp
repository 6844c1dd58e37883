// bd/kernel/matmul.hpp — a plain product a·b on the dispatched kernel, for preparation.
//
// Preparation runs in double, and in float where that is provably harmless (forming B = U_S·Vᵀ,
// Grams, refits). Eigen's own products are compiled with the flags of the program that
// includes bd — SSE2 in a default build, a quarter of what an AVX2 or AVX-512 core does.
// Products large enough to matter go through bd::kernel::gemm (runtime-dispatched); small ones,
// where packing would cost more than it saves, as dot products on the same kernel's dot_rows.
// Neither compiles Eigen's GEMM: what a program pays to compile for a product is bd's kernels,
// once per (ISA, scalar type), whatever the call sites' expression types. Operands with direct
// access are read in place, transposed ones too (`matmul(V.transpose(), V)` copies nothing): the
// kernel packs either storage order.
#pragma once

#include <algorithm>
#include <memory>
#include <numeric>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "bd/kernel/gemm.hpp"

namespace bd::kernel {

/// Multiply-adds below which matmul() computes the product as dot products (detail::product_small).
inline constexpr Index matmul_threshold = Index(64) * 64 * 64;

namespace detail {

/// An operand as the kernel reads it: a pointer, a leading dimension and a storage order.
template <typename T>
struct Operand {
  const T* data = nullptr;
  Index ld = 0;
  bool row_major = false;
};

template <typename Derived>
constexpr bool directly_readable_v = (int(Derived::Flags) & Eigen::DirectAccessBit) != 0;

/// The operand of an expression with direct access and unit inner stride (a matrix, a block, a
/// Map or Ref, or the transpose of one); anything else is evaluated into `storage` first.
template <typename Derived, typename T = typename Derived::Scalar>
Operand<T> operand(const Eigen::MatrixBase<Derived>& m, Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>& storage) {
  if constexpr (directly_readable_v<Derived>) {
    if (m.innerStride() == 1) return {m.derived().data(), m.outerStride(), bool(Derived::IsRowMajor)};
  }
  storage = m;
  return {storage.data(), storage.outerStride(), false};
}

/// out = X·B on the dispatched kernel: X rows × depth, B depth × cols, every column of X one
/// channel in order; lower_only: only the micro-tiles that meet the lower triangle (a Gram).
template <typename T>
void product_on_kernel(const Operand<T>& x, const Operand<T>& b, Index rows, Index depth, Index cols, T* out, Index ldo,
                       bool lower_only, bool accumulate, Workspace& ws) {
  std::vector<Index> channels(static_cast<std::size_t>(depth));
  std::iota(channels.begin(), channels.end(), Index(0));
  GemmArguments<T, T> args;
  args.rows = rows;
  args.x = x.data, args.ldx = x.ld, args.x_row_major = x.row_major;
  args.b = b.data, args.ldb = b.ld, args.b_row_major = b.row_major;
  args.out = out, args.ldo = ldo;
  args.segments.push_back({channels.data(), depth, 0, cols});
  args.lower_only = lower_only;
  args.accumulate = accumulate;
  gemm_with<false>(args, {}, 0, ws);  // matmul_or_add sends a few rows to product_small
}

/// The channel lists 0, 1, …, n − 1 a thread's products have asked for (identity_channels), kept
/// in its Workspace. A longer list is a new array; earlier ones stay, so no pointer handed out
/// ever dangles (their sizes at least double, so they hold under twice the longest).
struct IdentityChannels {
  std::vector<std::unique_ptr<Index[]>> lists;
  std::size_t longest = 0;
  const Index* first(Index n) {
    const auto count = static_cast<std::size_t>(std::max<Index>(n, 1));
    if (count > longest) {
      longest = std::max(count, 2 * longest);
      lists.emplace_back(new Index[longest]);
      std::iota(lists.back().get(), lists.back().get() + longest, Index(0));
    }
    return lists.back().get();
  }
};
}  // namespace detail

/// The channel list 0, 1, …, n − 1 (a product whose K dimension is X's columns in order: a layer's
/// projection) from the calling thread's Workspace, so that building such a product's arguments
/// allocates nothing once the thread has asked for n channels. Valid while `ws` lives.
inline const Index* identity_channels(Index n, Workspace& ws) { return ws.local<detail::IdentityChannels>().first(n); }

/// out = x·w + bias for a layer's projection, on the dispatched kernel whatever its size (a
/// decoded token's few rows go through the skinny path: Eigen's product at SSE2 speed, on one
/// thread, is what this replaces). x (rows × depth) and out are column-major in T; w is stored
/// in S (T, or half / bfloat16, converted while it is packed: no widened copy of a weight),
/// depth × cols column-major, or with `transposed` its transpose cols × depth read in place.
/// bias: cols values the accumulators start from, or null. Same threads and workspace as gemm();
/// `compute`: f32, or bf16 (arguments.hpp's Compute).
template <typename T, typename S>
void linear_into(const T* x, Index ldx, Index rows, Index depth, const S* w, Index ldw, bool transposed, Index cols,
                 const T* bias, T* out, Index ldo, int threads = 0, Workspace& ws = default_workspace(),
                 Compute compute = Compute::F32) {
  if (rows == 0 || cols == 0) return;
  GemmArguments<T, S> args;
  args.rows = rows;
  args.x = x, args.ldx = ldx;
  args.b = w, args.ldb = ldw, args.b_row_major = transposed;
  args.out = out, args.ldo = ldo;
  args.init_values = bias;
  args.segments.push_back({identity_channels(depth, ws), depth, 0, cols});
  args.compute = compute;
  gemm(args, {}, threads, ws);
}

namespace detail {
/// product_small's copies of operands it cannot read as dot products in place (a Workspace's).
template <typename T>
struct SmallProductScratch {
  ScratchBuffer<T> rows;     ///< a, row-major (a column-major a, transposed)
  ScratchBuffer<T> columns;  ///< b, column-major (a row-major b, transposed)
};

/// out = a·b or out += a·b for a small product (or one of at most skinny_rows rows), as dot
/// products on the dispatched kernel's dot_rows: out(i, c) = a(i, :)·b(:, c), four rows of a
/// against a run of b's columns per call. Rows of a and columns of b are read where they are
/// contiguous (a row-major a, a column-major b: a Gram's aᵀ·a reads its operand in place) and
/// copied once otherwise — m·k or k·n values against the m·k·n multiply-adds. bd's own code,
/// compiled once per (ISA, scalar) with the kernels it already has. Eigen's GEMM, which this
/// replaced, compiled its GEMM chain for float and double in four storage orders into every
/// program that reached a product (the README's example: 14 % of its compiler memory, see
/// docs/architecture.md) and ran at the program's baseline ISA.
template <typename T>
void product_small(const Operand<T>& a, const Operand<T>& b, Index rows, Index depth, Index cols, T* out, Index ldo,
                   bool accumulate, Workspace& ws) {
  if (rows == 0 || cols == 0) return;
  if (depth == 0) {
    if (!accumulate)
      for (Index c = 0; c < cols; ++c) std::fill(out + c * ldo, out + c * ldo + rows, T(0));
    return;
  }
  const T* a_rows = a.data;
  Index lda = a.ld;
  const T* b_columns = b.data;
  Index ldb = b.ld;
  if (!a.row_major || b.row_major) {
    SmallProductScratch<T>& scratch = ws.local<SmallProductScratch<T>>();
    if (!a.row_major) {  // a(i, k) = a.data[k·ld + i]: read along k's columns, write row i's runs
      T* copy = scratch.rows.reserve(static_cast<std::size_t>(rows * depth));
      for (Index k = 0; k < depth; ++k)
        for (Index i = 0; i < rows; ++i) copy[i * depth + k] = a.data[k * a.ld + i];
      a_rows = copy, lda = depth;
    }
    if (b.row_major) {  // b(k, c) = b.data[k·ld + c]
      T* copy = scratch.columns.reserve(static_cast<std::size_t>(depth * cols));
      for (Index k = 0; k < depth; ++k)
        for (Index c = 0; c < cols; ++c) copy[c * depth + k] = b.data[k * b.ld + c];
      b_columns = copy, ldb = depth;
    }
  }
  constexpr Index run = 64;  // columns per call: the dots (4 × run values) stay on the stack
  const Index ahead = active_context().tuning.stream_prefetch / Index(sizeof(T));
  on_active_kernel<T>([&](auto kernel) {
    using Kernel = decltype(kernel);
    T dots[4 * run];
    for (Index c0 = 0; c0 < cols; c0 += run) {
      const Index n = std::min(run, cols - c0);
      for (Index i0 = 0; i0 < rows; i0 += 4) {
        const Index count = std::min<Index>(4, rows - i0);
        Kernel::dot_rows(count, a_rows + i0 * lda, lda, depth, b_columns + c0 * ldb, ldb, n, dots, ahead);
        for (Index c = 0; c < n; ++c) {
          T* o = out + (c0 + c) * ldo + i0;
          for (Index i = 0; i < count; ++i) o[i] = accumulate ? o[i] + dots[c * 4 + i] : dots[c * 4 + i];
        }
      }
    }
  });
}

/// out = a·b, or out += a·b: the checks, then the operands as pointers (the one boundary every
/// product crosses), small products on product_small, the rest on the kernel (lower_only: only
/// its micro-tiles that meet the lower triangle, see matmul_lower_part_into).
template <typename DerivedA, typename DerivedB, typename DerivedOut>
void matmul_or_add(const Eigen::MatrixBase<DerivedA>& a, const Eigen::MatrixBase<DerivedB>& b, Eigen::MatrixBase<DerivedOut>& out,
                   bool accumulate, Workspace& ws, bool lower_only = false) {
  using T = typename DerivedA::Scalar;
  static_assert(std::is_same_v<T, typename DerivedB::Scalar> && std::is_same_v<T, typename DerivedOut::Scalar>,
                "matmul: one scalar type");
  static_assert(!DerivedOut::IsRowMajor && directly_readable_v<DerivedOut>,
                "matmul: the output is a column-major matrix, block or Ref");
  if (a.cols() != b.rows() || out.rows() != a.rows() || out.cols() != b.cols())
    throw ShapeError(bd::detail::message("matmul: a is ", a.rows(), "x", a.cols(), ", b is ", b.rows(), "x", b.cols(), " and out is ",
                                         out.rows(), "x", out.cols(), "; expected a.cols() == b.rows() and out a.rows() x b.cols()"));
  if (out.innerStride() != 1) throw ShapeError("matmul: the output's inner stride must be 1 (contiguous columns)");
  Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic> a_storage, b_storage;
  const Operand<T> x = operand(a, a_storage), y = operand(b, b_storage);
  if (a.rows() * a.cols() * b.cols() < matmul_threshold || a.rows() <= skinny_rows)
    product_small(x, y, a.rows(), a.cols(), b.cols(), out.derived().data(), out.outerStride(), accumulate, ws);
  else
    product_on_kernel(x, y, a.rows(), a.cols(), b.cols(), out.derived().data(), out.outerStride(), lower_only, accumulate, ws);
}
}  // namespace detail

/// out = a·b (a: L×K, b: K×N; column-major out, any operands) on the dispatched kernel. On up
/// to omp_get_max_threads() threads, one inside a parallel region (preparation's per-head loops);
/// the packing space is the calling thread's in `ws`.
template <typename DerivedA, typename DerivedB, typename DerivedOut>
void matmul_into(const Eigen::MatrixBase<DerivedA>& a, const Eigen::MatrixBase<DerivedB>& b,
                 Eigen::MatrixBase<DerivedOut>& out, Workspace& ws = default_workspace()) {
  detail::matmul_or_add(a, b, out, false, ws);
}

/// out += a·b, as matmul_into (the kernel's accumulators start from out's values).
template <typename DerivedA, typename DerivedB, typename DerivedOut>
void matmul_add_into(const Eigen::MatrixBase<DerivedA>& a, const Eigen::MatrixBase<DerivedB>& b,
                     Eigen::MatrixBase<DerivedOut>& out, Workspace& ws = default_workspace()) {
  detail::matmul_or_add(a, b, out, true, ws);
}

/// out = a·b where it is wanted on and below the diagonal only: every out(i, c) with i ≥ c is
/// a·b's; the kernel skips its micro-tiles that lie wholly above the diagonal and leaves those
/// outputs unwritten (others above it may be written). What a causal attention block needs of its
/// scores, key c against query i: on the diagonal block about a third of the tiles are skipped.
template <typename DerivedA, typename DerivedB, typename DerivedOut>
void matmul_lower_part_into(const Eigen::MatrixBase<DerivedA>& a, const Eigen::MatrixBase<DerivedB>& b,
                            Eigen::MatrixBase<DerivedOut>& out, Workspace& ws = default_workspace()) {
  detail::matmul_or_add(a, b, out, false, ws, true);
}

namespace detail {
/// out = a·t for a triangular t (N×N, Eigen::Upper or Eigen::Lower; the other triangle must hold
/// zeros: those in the diagonal blocks are read). In four column blocks, block j needs only the
/// rows of t that reach it — the leading ones up to its last column for an upper t, the trailing
/// ones from its first column for a lower t — so the blocks cost 5/8 of the dense product, and
/// the skipped terms are exact zeros: the result is the dense product's.
template <int Mode, typename DerivedA, typename DerivedT, typename DerivedOut>
void matmul_triangular_into(const Eigen::MatrixBase<DerivedA>& a, const Eigen::MatrixBase<DerivedT>& t,
                            Eigen::MatrixBase<DerivedOut>& out, Workspace& ws) {
  static_assert(Mode == Eigen::Upper || Mode == Eigen::Lower, "matmul_triangular_into: Upper or Lower");
  const Index n = t.cols();
  if (t.rows() != n || a.cols() != n || out.rows() != a.rows() || out.cols() != n)
    throw ShapeError(bd::detail::message("matmul_triangular_into: a is ", a.rows(), "x", a.cols(), ", t is ", t.rows(), "x", n,
                                         " and out is ", out.rows(), "x", out.cols(), "; expected t square, a.cols() == t.rows() and out a.rows() x t.cols()"));
  const Index width = (n + 3) / 4;
  for (Index c0 = 0; c0 < n; c0 += width) {
    const Index w = std::min(width, n - c0);
    const Index k0 = Mode == Eigen::Upper ? 0 : c0, k1 = Mode == Eigen::Upper ? c0 + w : n;
    auto block = out.middleCols(c0, w);
    matmul_into(a.middleCols(k0, k1 - k0), t.block(k0, c0, k1 - k0, w), block, ws);
  }
}
}  // namespace detail

/// out = a·u for an upper-triangular u (N×N; entries below the diagonal must be zero: those in
/// the diagonal blocks are read), at 5/8 of the dense product's cost (detail::matmul_triangular_into).
template <typename DerivedA, typename DerivedU, typename DerivedOut>
void matmul_upper_into(const Eigen::MatrixBase<DerivedA>& a, const Eigen::MatrixBase<DerivedU>& u,
                       Eigen::MatrixBase<DerivedOut>& out, Workspace& ws = default_workspace()) {
  detail::matmul_triangular_into<Eigen::Upper>(a, u, out, ws);
}

/// out = a·l for a lower-triangular l (N×N; entries above the diagonal must be zero: those in
/// the diagonal blocks are read), at 5/8 of the dense product's cost.
template <typename DerivedA, typename DerivedL, typename DerivedOut>
void matmul_lower_into(const Eigen::MatrixBase<DerivedA>& a, const Eigen::MatrixBase<DerivedL>& l,
                       Eigen::MatrixBase<DerivedOut>& out, Workspace& ws = default_workspace()) {
  detail::matmul_triangular_into<Eigen::Lower>(a, l, out, ws);
}

/// out = aᵀ·a (a: K×N, out: N×N), exactly symmetric: the dispatched kernel computes only the
/// micro-tiles that meet the lower triangle (28 of 44 at N = 128 with AVX-512's 32×12 float
/// tiles; packing is unchanged, so a 2048×128 float Gram takes about 77 % of the full product's
/// time) and the strict upper triangle is copied from it. Small products are dot products like
/// matmul_into's. `a` is read in place (a transposed operand too).
template <typename Derived, typename DerivedOut>
void gram_into(const Eigen::MatrixBase<Derived>& a, Eigen::MatrixBase<DerivedOut>& out, Workspace& ws = default_workspace()) {
  using T = typename Derived::Scalar;
  static_assert(std::is_same_v<T, typename DerivedOut::Scalar>, "gram: one scalar type");
  static_assert(!DerivedOut::IsRowMajor && detail::directly_readable_v<DerivedOut>,
                "gram: the output is a column-major matrix, block or Ref");
  if (out.rows() != a.cols() || out.cols() != a.cols())
    throw ShapeError(bd::detail::message("gram: a is ", a.rows(), "x", a.cols(), " and out is ", out.rows(), "x", out.cols(),
                                         "; expected out a.cols() x a.cols()"));
  if (out.innerStride() != 1) throw ShapeError("gram: the output's inner stride must be 1 (contiguous columns)");
  const Index n = a.cols();
  Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic> storage;
  const detail::Operand<T> y = detail::operand(a, storage);
  const detail::Operand<T> x{y.data, y.ld, !y.row_major};  // aᵀ: the same storage read in the other order
  if (n * n * a.rows() < matmul_threshold || n <= detail::skinny_rows)
    detail::product_small(x, y, n, a.rows(), n, out.derived().data(), out.outerStride(), false, ws);
  else
    detail::product_on_kernel(x, y, n, a.rows(), n, out.derived().data(), out.outerStride(), true, false, ws);
  for (Index j = 1; j < n; ++j)
    for (Index i = 0; i < j; ++i) out(i, j) = out(j, i);
}

/// aᵀ·a as a new column-major matrix (see gram_into).
template <typename Derived>
Eigen::Matrix<typename Derived::Scalar, Eigen::Dynamic, Eigen::Dynamic> gram(const Eigen::MatrixBase<Derived>& a,
                                                                          Workspace& ws = default_workspace()) {
  Eigen::Matrix<typename Derived::Scalar, Eigen::Dynamic, Eigen::Dynamic> out(a.cols(), a.cols());
  gram_into(a, out, ws);
  return out;
}

/// a·b as a new column-major matrix.
template <typename DerivedA, typename DerivedB>
Eigen::Matrix<typename DerivedA::Scalar, Eigen::Dynamic, Eigen::Dynamic> matmul(const Eigen::MatrixBase<DerivedA>& a,
                                                                              const Eigen::MatrixBase<DerivedB>& b,
                                                                              Workspace& ws = default_workspace()) {
  Eigen::Matrix<typename DerivedA::Scalar, Eigen::Dynamic, Eigen::Dynamic> out(a.rows(), b.cols());
  matmul_into(a, b, out, ws);
  return out;
}

/// The instantiations bd::compiled holds (src/compiled_kernel.cpp), extern under BD_COMPILED_LIB.
#define BD_MATMUL_INSTANTIATIONS(prefix)                                                                                      \
  prefix void detail::product_small<float>(const detail::Operand<float>&, const detail::Operand<float>&, Index, Index, Index,   \
                                           float*, Index, bool, Workspace&);                                                 \
  prefix void detail::product_small<double>(const detail::Operand<double>&, const detail::Operand<double>&, Index, Index, Index, \
                                            double*, Index, bool, Workspace&);                                               \
  prefix void detail::product_on_kernel<float>(const detail::Operand<float>&, const detail::Operand<float>&, Index, Index, Index, \
                                               float*, Index, bool, bool, Workspace&);                                       \
  prefix void detail::product_on_kernel<double>(const detail::Operand<double>&, const detail::Operand<double>&, Index, Index,    \
                                                Index, double*, Index, bool, bool, Workspace&);
#ifdef BD_COMPILED_LIB
BD_MATMUL_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::kernel
