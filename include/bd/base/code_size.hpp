// bd/base/code_size.hpp — how much code the compiler makes of a header function: BD_NOINLINE
// for one copy instead of one per caller, BD_COLD for code that runs once per call.
//
// A header-only library's functions are compiled in every program that calls them, and at -O3
// GCC copies mid-sized ones into each caller and widens, unrolls and versions every loop. That
// is what bd's numerical kernels want; it is not what preparation's bookkeeping wants — choosing
// a strategy, assembling a layer, checking shapes — which runs once per call and spends its time
// in the kernels it calls. Compiled for speed, that bookkeeping was 17 KB of the README's
// example's 429 KB of code and 23 KB of the attention program's 558 KB (compile time goes with
// code, ~30 ms per KB with g++ -O3), for no measurable difference in preparation time.
//
//   BD_NOINLINE  one out-of-line copy (a workspace lookup called from a few dozen places).
//   BD_COLD      optimised for size (GCC's and Clang's `cold`: no inlining that grows the code,
//                no unrolling or loop vectorisation), and calls to it treated as unlikely. Only
//                for functions whose own loops are not where the time goes: their callees —
//                the fits, the scores, the kernels — keep the flags of the program.
//
// And for the kernels' inner loops, what GCC and Clang are told and any other compiler skips:
//   BD_ALWAYS_INLINE   a vector helper inlined into its caller (the registers it holds stay there)
//   BD_UNROLL(n)       unroll the next loop n times (a loop over a tile's columns: registers)
//   BD_PREFETCH(...)   __builtin_prefetch's request for a line ahead of its use
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define BD_NOINLINE __attribute__((noinline))
#define BD_COLD __attribute__((cold))
#define BD_ALWAYS_INLINE __attribute__((always_inline))
#define BD_PRAGMA(text) _Pragma(#text)
#define BD_UNROLL(n) BD_PRAGMA(GCC unroll n)
#define BD_PREFETCH(...) __builtin_prefetch(__VA_ARGS__)
#elif defined(_MSC_VER)
#define BD_NOINLINE __declspec(noinline)
#define BD_COLD
#define BD_ALWAYS_INLINE
#define BD_UNROLL(n)
#define BD_PREFETCH(...) ((void)0)
#else
#define BD_NOINLINE
#define BD_COLD
#define BD_ALWAYS_INLINE
#define BD_UNROLL(n)
#define BD_PREFETCH(...) ((void)0)
#endif
