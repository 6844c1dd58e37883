// bd/kernel/dispatch.hpp — runs a routine on the micro-kernel of the instruction set the program
// runs on (cpu.hpp's active_isa()): the one place that turns the run-time choice into a type.
//
//   on_active_kernel<T>([&](auto k) { k.lu_rows(a, n, ld, perm); });   // a static routine
//   on_active_kernel<T>([](auto k) -> decltype(auto) {                  // its table for a loop
//     return packed_kernel<decltype(k), T, S>();                        // compiled once per scalar
//   });                                                                 // (loop.hpp)
// Every loop over micro-tiles takes such a table of the routines it calls (PackedKernel,
// FlashTileKernel, FewRowKernel), built once per instruction set and scalar type, so only the
// routines themselves are compiled once per instruction set — and a program compiles only the
// routines of the loops it runs (a decomposition's GEMM none of the attention's or decoding's).
//
// k is Avx512Kernel<T>, Avx2Kernel<T> or PortableKernel<T> (empty structs of static routines);
// the wide ones exist for float and double on x86, every other case runs the portable one.
#pragma once

#include <type_traits>

#include "bd/kernel/cpu.hpp"
#include "bd/kernel/micro_kernel_avx2.hpp"
#include "bd/kernel/micro_kernel_avx512.hpp"
#include "bd/kernel/micro_kernel_portable.hpp"

namespace bd::kernel {

/// f(K{}) for the micro-kernel K of active_isa(); returns what f returns.
template <typename T, typename F>
decltype(auto) on_active_kernel(F&& f) {
#ifdef BD_KERNEL_X86
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    const Isa isa = active_isa();
    if (isa == Isa::AVX512) return f(Avx512Kernel<T>{});
    if (isa == Isa::AVX2) return f(Avx2Kernel<T>{});
  }
#endif
  return f(PortableKernel<T>{});
}

}  // namespace bd::kernel
