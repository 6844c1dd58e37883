// The kernels' instruction set is chosen when the program runs: the widest the CPU has, unless
// BD_CPU (or use_isa) asks for another; a set the CPU lacks is refused by name.
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <bd/kernel/cpu.hpp>

#include "support.hpp"

using bd::kernel::Isa;
using Catch::Contains;

namespace {

/// The CPU's feature flags as Linux lists them in /proc/cpuinfo (empty elsewhere): a source
/// independent of the compiler's CPU model that cpu_has() uses.
std::set<std::string> cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

}  // namespace

TEST_CASE("kernel dispatch: the default is the widest instruction set this CPU has", "[kernel][cpu]") {
  const auto flags = cpuinfo_flags();
  if (flags.empty()) {
    WARN("skipped: no /proc/cpuinfo to compare with");
    return;
  }
  const auto has = [&](const char* f) { return flags.count(f) > 0; };
  const bool avx2 = has("avx2") && has("fma");
  const bool avx512 = avx2 && has("avx512f") && has("avx512bw") && has("avx512dq") && has("avx512vl");
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  const Isa expected = avx512 ? Isa::AVX512 : avx2 ? Isa::AVX2 : Isa::Portable;
#else
  const Isa expected = Isa::Portable;
#endif
  INFO("/proc/cpuinfo: avx2+fma " << avx2 << ", avx512 f/bw/dq/vl " << avx512 << "; bd runs " << bd::kernel::cpu_isas());
  CHECK(bd::kernel::best_isa() == expected);
  if (const char* forced = std::getenv("BD_CPU")) {
    CHECK(bd::kernel::active_isa() == bd::kernel::parse_isa(forced, "BD_CPU"));
  } else {
    CHECK(bd::kernel::active_isa() == expected);
  }
}

TEST_CASE("kernel dispatch: BD_CPU names a path — unknown or unavailable ones are refused", "[kernel][cpu]") {
  CHECK(bd::kernel::parse_isa("portable", "BD_CPU") == Isa::Portable);
  BD_CHECK_THROWS_CONTAINING(bd::kernel::parse_isa("sse9", "BD_CPU"), bd::RangeError,
                             Contains("BD_CPU is 'sse9': expected portable, avx2 or avx512"));
  for (Isa isa : {Isa::AVX2, Isa::AVX512}) {
    if (bd::kernel::cpu_has(isa)) {
      CHECK(bd::kernel::parse_isa(bd::kernel::to_string(isa), "BD_CPU") == isa);
    } else {
      BD_CHECK_THROWS_CONTAINING(bd::kernel::parse_isa(bd::kernel::to_string(isa), "BD_CPU"), bd::RangeError,
                                 Contains("which this CPU lacks"));
      BD_CHECK_THROWS_CONTAINING(bd::kernel::use_isa(isa), bd::RangeError, Contains("this CPU lacks it"));
    }
  }
}
