// bd/base/inline.hpp — BD_NOINLINE, for the few header functions that are compiled once and
// called from many places rather than copied into each caller.
//
// A header-only library's non-template function is inline by necessity, and at -O3 GCC copies
// a mid-sized one into every caller. Where the callers are many and the function is not on a
// hot path (a workspace lookup, an error's formatting), a copy per call site only costs compile
// time and code; BD_NOINLINE keeps one.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define BD_NOINLINE __attribute__((noinline))
#elif defined(_MSC_VER)
#define BD_NOINLINE __declspec(noinline)
#else
#define BD_NOINLINE
#endif
