// bd_bench's main: Google Benchmark's, with what a reader needs to compare runs written into the
// JSON context beside the machine's caches and clock — the instruction set bd's kernels run
// (`bd_isa`: BD_CPU or the widest the CPU has) and the ones the CPU offers, the context's CPU
// description and tuning (`bd_context`, `bd_tuning`: its row, BD_TUNING applied), the CPU's name, and
// OpenBLAS's core type (OPENBLAS_CORETYPE forces it, as BD_CPU forces bd's), so that a figure is
// never read without the ISA it was measured on.
#include <benchmark/benchmark.h>

#include <bd/kernel/context.hpp>

#include <fstream>
#include <string>

#ifdef BD_HAVE_OPENBLAS
extern "C" char* openblas_get_corename(void);
#endif

namespace {

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("bd_isa", bd::kernel::to_string(bd::kernel::active_isa()));
  benchmark::AddCustomContext("bd_cpu_isas", bd::kernel::cpu_isas());
  benchmark::AddCustomContext("bd_context", bd::kernel::active_context().describe());
  benchmark::AddCustomContext("bd_tuning", bd::kernel::to_string(bd::kernel::active_context().tuning));
  benchmark::AddCustomContext("cpu_name", cpu_name());
#ifdef BD_HAVE_OPENBLAS
  benchmark::AddCustomContext("openblas_core", openblas_get_corename());
#endif
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
