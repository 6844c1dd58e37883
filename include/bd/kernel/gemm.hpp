// bd/kernel/gemm.hpp — bd::kernel::gemm, the GEMM behind every BD projection:
//
//     out[:, col(c)] = init(c) + Σ_k X[:, chan(k)] · B(k, c)          (arguments.hpp)
//
// Three things a plain GEMM call cannot do, done where they cost nothing: X's channels are
// gathered while packing (pack.hpp), the accumulators start from init(c) so the output is
// written once (loop.hpp), and a half/bfloat16 B is converted panel by panel (pack.hpp).
//
// The micro-kernel is chosen when the program runs (cpu.hpp): AVX-512, AVX2 + FMA or portable,
// whatever flags the program was compiled with. float and double have SIMD kernels; other
// arithmetic types run the portable one.
#pragma once

#include <type_traits>

#include "bd/kernel/arguments.hpp"
#include "bd/kernel/context.hpp"
#include "bd/kernel/cpu.hpp"
#include "bd/kernel/dispatch.hpp"
#include "bd/kernel/loop.hpp"
#include "bd/kernel/skinny.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace bd::kernel {

namespace detail {

/// The storage names of the types a product may take, for messages.
template <typename T>
constexpr const char* type_name() {
  if constexpr (std::is_same_v<T, double>) return "f64";
  else if constexpr (std::is_same_v<T, float>) return "f32";
  else if constexpr (std::is_same_v<T, Eigen::half>) return "f16";
  else if constexpr (std::is_same_v<T, Eigen::bfloat16>) return "bf16";
  else return "another type";
}

/// Whether a product of arithmetic T on B stored in S can compute in bf16: float arithmetic on a
/// B stored in float or bfloat16. A half B is not rounded a second time (11 → 8 bits of
/// mantissa): bf16 compute multiplies operands rounded once (docs/design.md, "Compute type").
template <typename T, typename S>
constexpr bool bf16_computable = std::is_same_v<T, float> && (std::is_same_v<S, float> || std::is_same_v<S, Eigen::bfloat16>);

/// gemm() with Layer: true, at most skinny_rows rows of a column-major X take the skinny path and
/// bf16 compute is taken; false for a caller whose products are preparation's, never of a few
/// rows (matmul sends those to product_small) and always in their own type, so that a program
/// multiplying only through it — a decomposition — compiles none of the skinny path's kernels
/// (about 100 KB of code in the README's example) nor bf16's packing.
template <bool Layer, typename T, typename S>
void gemm_with(const GemmArguments<T, S>& a, const Blocking& blk, int threads, Workspace& ws) {
  if (a.rows < 0 || (!a.x_row_major && a.ldx < a.rows) || a.ldo < a.rows)
    throw ShapeError(bd::detail::message("bd::kernel::gemm: ", a.rows, " rows with leading dimensions ldx = ", a.ldx, " and ldo = ",
                                         a.ldo, "; expected rows ≥ 0, ldo ≥ rows and (column-major x) ldx ≥ rows"));
  Index total = 0;
  for (const auto& seg : a.segments) total += seg.width;
  if (a.rows == 0 || total == 0) return;
#ifdef _OPENMP
  if (threads <= 0) threads = omp_in_parallel() ? 1 : omp_get_max_threads();
#else
  threads = 1;
#endif
  // The skinny path (skinny.hpp) for a few rows of a column-major X, compiled only where
  // Layer asks for it; the packed one otherwise (loop.hpp). Each loop once per scalar type.
  const Context& context = active_context();
  if constexpr (Layer) {
    if (a.compute == Compute::BF16) {
      if constexpr (!bf16_computable<T, S>) {
        throw RangeError(bd::detail::message(
            "bd::kernel::gemm: bf16 compute multiplies operands rounded once to bf16 in f32 arithmetic; this product's "
            "arithmetic is ", type_name<T>(), " and its B is stored in ", type_name<S>(),
            std::is_same_v<S, Eigen::half> ? " (rounding f16 weights to bf16 would round them twice: store them in bf16, or "
                                             "compute in f32)"
                                           : " (compute in f32)"));
      } else if (a.rows > skinny_rows || a.x_row_major) {
        if (a.x_row_major)
          throw RangeError("bd::kernel::gemm: bf16 compute reads X column-major (a layer's activations); this X is row-major");
        // X's channels rounded once into a compact copy that the packing reads (RoundedInput).
        const Packing packing = context.bf16_method() == Bf16Method::Dot ? Packing::Pairs : Packing::Rounded;
        GemmArguments<T, S> rounded;
        const bool paired = round_input(a, threads, packing == Packing::Pairs, ws.local<RoundedInput<T>>(), rounded);
        const PackedKernel<T, S>& kernel = on_active_kernel<T>(
            [packing, paired](auto k) -> decltype(auto) { return bf16_packed_kernel<decltype(k), T, S>(packing, paired); });
        return gemm_packed(a, rounded, total, blk, threads, kernel, context, ws);
      }
    }
    if (a.rows <= skinny_rows && !a.x_row_major)
      return gemm_skinny(a, threads,
                         on_active_kernel<T>([](auto k) -> decltype(auto) { return few_row_kernel<decltype(k), T>(); }),
                         context, ws.local<SkinnyScratch<T>>());
  }
  const PackedKernel<T, S>& kernel =
      on_active_kernel<T>([](auto k) -> decltype(auto) { return packed_kernel<decltype(k), T, S>(); });
  gemm_packed(a, a, total, blk, threads, kernel, context, ws);
}
}  // namespace detail

/// The most channels per pass that Blocking{}'s kc = 0 takes on active_isa()'s kernel for T in a
/// product whose deepest segment has `depth` channels (0: any depth), from this CPU's L1
/// (Context::depth_block).
template <typename T>
Index default_depth(Index depth = 0) {
  return on_active_kernel<T>([depth](auto k) { return active_context().depth_block(decltype(k)::nr, sizeof(T), depth); });
}

/// The most rows per packed A block that Blocking{}'s mc = 0 takes on active_isa()'s kernel for
/// T in passes of `depth` channels (0: the default depth), with an L2 of `l2` bytes (this CPU's
/// by default): whole micro-tiles filling at most half of it, at most the tuning's mc
/// (Context::row_block).
template <typename T>
Index default_row_block(Index depth = 0, long l2 = l2_bytes()) {
  return on_active_kernel<T>([depth, l2](auto k) {
    using K = decltype(k);
    Context context = active_context();
    context.cpu.l2 = l2;
    return context.row_block(K::mr, depth > 0 ? depth : context.depth_block(K::nr, sizeof(T)), sizeof(T));
  });
}

/// Runs the GEMM on up to `threads` OpenMP threads (0: omp_get_max_threads(), which honours
/// OMP_NUM_THREADS; 1 inside a parallel region) with the kernels of active_isa(); at most
/// skinny_rows rows of a column-major X take the skinny path (skinny.hpp). a.compute = BF16
/// (T float, B stored in float or bfloat16; RangeError otherwise) rounds X and B to bfloat16 as
/// they are packed and sums their products in float: vdpbf16ps where the context has it, FMAs on
/// the rounded operands in vdpbf16ps's order elsewhere, the same bits (the skinny path's sums run
/// in its own order, as in f32). Preconditions (checked where cheap; ShapeError): pointers and leading dimensions cover every
/// index the segments, channel and column lists name. Results are bit-identical for any number
/// of threads; different instruction sets sum in different orders (last-bit differences). The
/// packing space is the calling thread's in `ws` (kept there for the next call).
template <typename T, typename S>
void gemm(const GemmArguments<T, S>& a, const Blocking& blk = {}, int threads = 0, Workspace& ws = default_workspace()) {
  detail::gemm_with<true>(a, blk, threads, ws);
}

/// The instantiations bd::compiled holds (src/compiled_kernel.cpp); where BD_COMPILED_LIB is
/// defined (a program linking it) they are declared extern and compiled nowhere else.
#define BD_GEMM_INSTANTIATIONS(prefix)                                                              \
  prefix void gemm<float, float>(const GemmArguments<float, float>&, const Blocking&, int, Workspace&);       \
  prefix void gemm<float, Eigen::half>(const GemmArguments<float, Eigen::half>&, const Blocking&, int, Workspace&); \
  prefix void gemm<float, Eigen::bfloat16>(const GemmArguments<float, Eigen::bfloat16>&, const Blocking&, int, Workspace&); \
  prefix void gemm<double, double>(const GemmArguments<double, double>&, const Blocking&, int, Workspace&);   \
  prefix void gemm<double, float>(const GemmArguments<double, float>&, const Blocking&, int, Workspace&);
#ifdef BD_COMPILED_LIB
BD_GEMM_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::kernel
