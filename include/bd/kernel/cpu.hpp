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

#if defined(__has_include)
#if __has_include(<unistd.h>)
#include <unistd.h>  // sysconf: the caches' sizes
#endif
#endif

#include "bd/base/code_size.hpp"
#include "bd/base/error.hpp"
#include "bd/base/names.hpp"

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) && !defined(BD_NO_DISPATCH)
#define BD_KERNEL_X86 1
// Per-function instruction sets. AVX-512 kernels ask for the same four extensions the CPU check
// requires, so that nothing they inline can need more than was verified.
// The kernels are vectorised by hand; GCC's loop vectoriser would only vectorise their scalar
// tails again (a vector loop and an epilogue per tail): code a program compiles for no speed
// (docs/architecture.md, "Compile time"). Clang has no such attribute.
#if defined(__clang__)
#define BD_HAND_VECTORISED
#else
#define BD_HAND_VECTORISED , optimize("no-tree-loop-vectorize")
#endif
#define BD_TARGET_AVX2 __attribute__((target("avx2,fma,f16c") BD_HAND_VECTORISED))
#define BD_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c") BD_HAND_VECTORISED))
// vdpbf16ps: called only where the context says the CPU has AVX512-BF16 (context.hpp).
#define BD_TARGET_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c") BD_HAND_VECTORISED))
#include <cpuid.h>
#endif

namespace bd::kernel {

enum class Isa {
  Portable = 0, AVX2 = 1, AVX512 = 2,
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

/// Who made the CPU (cpuid's vendor string), for the tuning table (context.hpp).
enum class Vendor { Other, AMD, Intel };

/// What bd reads of a CPU to choose its kernels' tuning (context.hpp): who made it, its family
/// and model, its caches, and its bf16 units. this_cpu() reads the machine's; tests build others.
struct CpuDescription {
  Vendor vendor = Vendor::Other;
  int family = 0, model = 0;  ///< cpuid's display family and model (extended fields folded in)
  long l1d = 32L << 10;       ///< L1 data cache of a core, bytes
  long l2 = 512L << 10;       ///< L2 cache of a core, bytes
  bool avx512_bf16 = false;   ///< vdpbf16ps (AVX512-BF16), with the AVX-512 state the OS saves
  bool amx_bf16 = false;      ///< AMX tiles with bf16 (tdpbf16ps)

  /// "AMD family 26 model 2 (L1d 48 KiB, L2 1024 KiB, avx512_bf16)".
  BD_COLD std::string describe() const {
    std::string out = vendor == Vendor::AMD ? "AMD" : vendor == Vendor::Intel ? "Intel" : "CPU";
    out += " family " + std::to_string(family) + " model " + std::to_string(model) + " (L1d " +
           std::to_string(l1d >> 10) + " KiB, L2 " + std::to_string(l2 >> 10) + " KiB";
    if (avx512_bf16) out += ", avx512_bf16";
    if (amx_bf16) out += ", amx_bf16";
    return out + ")";
  }
};

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

/// This machine's description, read once: cpuid for the vendor, family, model and bf16 units;
/// glibc's sysconf for the caches, else 32 KiB of L1 (every AVX2 and AVX-512 CPU has at least
/// that) and 512 KiB of L2 (the smallest per-core L2 among the AVX-512 CPUs and AMD's AVX2 ones;
/// Intel's AVX2 client cores have 256 KiB and report it).
BD_COLD inline CpuDescription read_this_cpu() {
  CpuDescription cpu;
  cpu.l1d = cache_bytes(1, 16L << 10, 4L << 20, 32L << 10);
  cpu.l2 = cache_bytes(2, 64L << 10, 64L << 20, 512L << 10);
#ifdef BD_KERNEL_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    const unsigned max_leaf = a;
    if (b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163) cpu.vendor = Vendor::AMD;         // "AuthenticAMD"
    else if (b == 0x756e6547 && d == 0x49656e69 && c == 0x6c65746e) cpu.vendor = Vendor::Intel;  // "GenuineIntel"
    if (__get_cpuid(1, &a, &b, &c, &d)) {
      const int base_family = int((a >> 8) & 0xF), base_model = int((a >> 4) & 0xF);
      cpu.family = base_family == 0xF ? base_family + int((a >> 20) & 0xFF) : base_family;
      cpu.model = base_family == 0xF || base_family == 6 ? base_model | int((a >> 16) & 0xF) << 4 : base_model;
    }
    if (max_leaf >= 7) {
      __cpuid_count(7, 0, a, b, c, d);
      const bool amx = (d >> 22) & 1 && (d >> 24) & 1;  // AMX-BF16, AMX-TILE
      __cpuid_count(7, 1, a, b, c, d);
      cpu.avx512_bf16 = cpu_has(Isa::AVX512) && ((a >> 5) & 1);
      // The OS must save the tiles' state (XCR0 bits 17 and 18); a process still asks Linux for
      // it before its first tile instruction.
      unsigned xcr0 = 0, xcr0_high = 0;
      if (amx) __asm__("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0));
      cpu.amx_bf16 = amx && (xcr0 & 0x60000) == 0x60000;
    }
  }
#endif
  return cpu;
}
}  // namespace detail

/// This machine's description (read once).
inline const CpuDescription& this_cpu() {
  static const CpuDescription cpu = detail::read_this_cpu();
  return cpu;
}

/// The L1 data cache of the core the program runs on, in bytes.
inline long l1d_bytes() { return this_cpu().l1d; }

/// The L2 cache of the core the program runs on, in bytes.
inline long l2_bytes() { return this_cpu().l2; }

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
