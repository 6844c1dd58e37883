// bd/kernel/cpu.hpp — which instruction set the kernels run on, chosen when the program runs.
//
// bd is header-only, so its kernels are compiled with the flags of the program that includes
// them: usually no -march at all (x86-64 baseline, SSE2). The micro-kernels therefore carry
// their instruction set in a per-function target attribute and are compiled whatever the
// flags; this file picks, once per process, the widest set the CPU (and the OS, which must save
// the wide registers) supports:
//
//   Isa::AVX512    AVX-512 F, BW, DQ and VL (Skylake-X and later, Zen 4 and later)
//   Isa::AVX2      AVX2, FMA and F16C (Haswell and later, Zen 1 and later)
//   Isa::Portable  plain C++, any CPU and any compiler
//
// The environment variable BD_CPU=portable|avx2|avx512 forces a path (for tests and benchmark
// sweeps); a path the CPU lacks is refused with an error naming what the CPU has. In a program
// use_isa() does the same.
#pragma once

#include <atomic>
#include <cstdlib>
#include <string>

#include <unistd.h>  // sysconf

#include "bd/base/error.hpp"
#include "bd/base/names.hpp"

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) && !defined(BD_NO_DISPATCH)
#define BD_KERNEL_X86 1
// Per-function instruction sets. AVX-512 kernels ask for the same four extensions the CPU check
// requires, so that nothing they inline can need more than was verified.
// The kernels are vectorised by hand; GCC's loop vectoriser would only vectorise their scalar
// tails again (a vector loop and an epilogue per tail): 18 KB of the README's example's 455 KB
// of code, with no difference in the kernels' speed (Zen 4, both instruction sets). Clang has
// no such attribute.
#if defined(__clang__)
#define BD_HAND_VECTORISED
#else
#define BD_HAND_VECTORISED , optimize("no-tree-loop-vectorize")
#endif
#define BD_TARGET_AVX2 __attribute__((target("avx2,fma,f16c") BD_HAND_VECTORISED))
#define BD_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c") BD_HAND_VECTORISED))
#include <cpuid.h>
#endif

namespace bd::kernel {

enum class Isa {
  Portable = 0, AVX2 = 1, AVX512 = 2,
  // bd 0.1's spellings, kept for one release:
  portable [[deprecated("spelled Isa::Portable since bd 0.2")]] = Portable,
  avx2 [[deprecated("spelled Isa::AVX2 since bd 0.2")]] = AVX2,
  avx512 [[deprecated("spelled Isa::AVX512 since bd 0.2")]] = AVX512,
};

/// The names BD_CPU takes and reports print (base/names.hpp).
inline constexpr bd::detail::Named<Isa> isa_names[] = {{Isa::Portable, "portable"}, {Isa::AVX2, "avx2"}, {Isa::AVX512, "avx512"}};

inline const char* to_string(Isa isa) { return bd::detail::name_in(isa_names, isa); }

/// Whether this CPU (and OS) can run the kernels of `isa`. The compiler's CPU model checks the
/// OS's XCR0 bits too, so a kernel never faults on a CPU whose OS does not save zmm registers.
inline bool cpu_has(Isa isa) {
#ifdef BD_KERNEL_X86
  static const bool avx2 = [] {
    __builtin_cpu_init();
    // F16C (half conversions) is not in Clang's list of __builtin_cpu_supports names: CPUID.1:ECX.
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  }();
  static const bool avx512 = [] {
    __builtin_cpu_init();
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  }();
  switch (isa) {
    case Isa::AVX512: return avx512;
    case Isa::AVX2: return avx2;
    default: return true;
  }
#else
  return isa == Isa::Portable;
#endif
}

namespace detail {
/// sysconf's size of the cache at `level` (1: L1 data, 2: L2) when the C library knows it and it
/// lies within [low, high]; `fallback` otherwise (another C library, or a size a VM made up).
inline long cache_bytes(int level, long low, long high, long fallback) {
  long b = 0;
#if defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE)
  b = sysconf(level == 1 ? _SC_LEVEL1_DCACHE_SIZE : _SC_LEVEL2_CACHE_SIZE);
#else
  (void)level;
#endif
  return b >= low && b <= high ? b : fallback;
}
}  // namespace detail

/// The L1 data cache of the core the program runs on, in bytes (the GEMM's depth blocking,
/// loop.hpp): glibc's sysconf where it knows it, else 32 KiB (every AVX2 and AVX-512 CPU has at
/// least that). Read once.
inline long l1d_bytes() {
  static const long bytes = detail::cache_bytes(1, 16L << 10, 4L << 20, 32L << 10);
  return bytes;
}

/// The L2 cache of the core the program runs on, in bytes (the GEMM's row blocking, loop.hpp):
/// glibc's sysconf where it knows it, else 512 KiB (the smallest per-core L2 among the AVX-512
/// CPUs and AMD's AVX2 ones; Intel's AVX2 client cores have 256 KiB and report it). Read once.
inline long l2_bytes() {
  static const long bytes = detail::cache_bytes(2, 64L << 10, 64L << 20, 512L << 10);
  return bytes;
}

/// The widest instruction set this CPU runs.
inline Isa best_isa() {
  if (cpu_has(Isa::AVX512)) return Isa::AVX512;
  if (cpu_has(Isa::AVX2)) return Isa::AVX2;
  return Isa::Portable;
}

/// What the CPU has, for messages: "avx512, avx2, portable".
inline std::string cpu_isas() {
  std::string out;
  for (Isa isa : {Isa::AVX512, Isa::AVX2, Isa::Portable}) {
    if (!cpu_has(isa)) continue;
    if (!out.empty()) out += ", ";
    out += to_string(isa);
  }
  return out;
}

/// Parses "portable", "avx2" or "avx512"; throws RangeError otherwise or when the CPU lacks it.
inline Isa parse_isa(const char* name, const char* source) {
  const auto* entry = bd::detail::find_in(isa_names, name);
  if (!entry)
    throw RangeError(bd::detail::message(source, " is '", name, "': expected ", bd::detail::names_in(isa_names)));
  const Isa isa = entry->first;
  if (!cpu_has(isa))
    throw RangeError(bd::detail::message(source, " asks for ", name, ", which this CPU lacks (it runs: ", cpu_isas(), ")"));
  return isa;
}

namespace detail {
/// The process-wide choice: BD_CPU when set, the best path otherwise. Read once, on first use.
inline std::atomic<int>& isa_choice() {
  static std::atomic<int> choice{[] {
    const char* forced = std::getenv("BD_CPU");
    return static_cast<int>(forced && *forced ? parse_isa(forced, "BD_CPU") : best_isa());
  }()};
  return choice;
}
}  // namespace detail

/// The instruction set every kernel call uses now.
inline Isa active_isa() { return static_cast<Isa>(detail::isa_choice().load(std::memory_order_relaxed)); }

/// Makes every later kernel call use `isa` (tests, benchmark sweeps); RangeError when the CPU
/// lacks it. Not meant to be called while another thread runs a kernel.
inline void use_isa(Isa isa) {
  if (!cpu_has(isa))
    throw RangeError(bd::detail::message("use_isa(", to_string(isa), "): this CPU lacks it (it runs: ", cpu_isas(), ")"));
  detail::isa_choice().store(static_cast<int>(isa), std::memory_order_relaxed);
}

}  // namespace bd::kernel
