// The CUDA projection's argument checks, on the host: no GPU needed, so these run wherever nvcc
// builds the CUDA header (ctest label cuda-host). Each refusal names what is wrong.
#include <bd/cuda/projection.cuh>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <string>

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAILED", what.c_str());
  if (!ok) ++failures;
}

// check_arguments reads pointers only for null and alignment: stand-ins, never dereferenced.
__half* fake(std::uintptr_t address) { return reinterpret_cast<__half*>(address); }

bd::cuda::ProjectionArguments<__half> valid() {
  bd::cuda::ProjectionArguments<__half> a;
  a.x = fake(0x1000), a.coeff = fake(0x2000), a.out = fake(0x3000);
  a.rows = 4, a.input_dim = 64, a.head_dim = 16, a.heads = 2, a.window_offset = 8;
  return a;
}

void refused(bd::cuda::ProjectionArguments<__half> a, const std::string& needle, const std::string& what) {
  const bd::cuda::Status s = bd::cuda::detail::check_arguments(a, "BDProjection");
  expect(!s.ok() && s.message().find(needle) != std::string::npos, what + " refused: " + s.message());
}

}  // namespace

int main() {
  expect(bd::cuda::detail::check_arguments(valid(), "BDProjection").ok(), "valid arguments accepted");
  auto a = valid();
  a.window_offset = INT_MAX - 7;  // a multiple of 8; offset + head_dim overflows int
  refused(a, "outside", "window offset near INT_MAX");
  a = valid(), a.window_offset = 56;
  refused(a, "outside", "window past the end");
  a = valid(), a.window_offset = -8;
  refused(a, "outside", "negative window offset");
  a = valid(), a.window_offset = 4;
  refused(a, "multiples of 8", "offset not a multiple of 8");
  a = valid(), a.input_dim = 60;
  refused(a, "multiples of 8", "input_dim not a multiple of 8");
  a = valid(), a.rows = -1;
  refused(a, "rows", "negative rows");
  a = valid(), a.heads = 0;
  refused(a, "heads", "zero heads");
  a = valid(), a.head_dim = 72;
  refused(a, "exceeds", "head_dim over input_dim");
  a = valid(), a.input_dim = INT_MAX / 8 * 8, a.head_dim = 1 << 16, a.heads = 1 << 15, a.window_offset = 0;
  refused(a, "32-bit", "heads·head_dim past 32 bits");
  a = valid(), a.x = fake(0x1002);
  refused(a, "16-byte aligned", "misaligned x");
  a = valid(), a.out = nullptr;
  refused(a, "null", "null out");
  a = valid(), a.rows = 0, a.out = nullptr;
  expect(bd::cuda::detail::check_arguments(a, "BDProjection").ok(), "zero rows need no buffers");
  std::printf(failures ? "%d check(s) FAILED\n" : "all argument checks passed\n", failures);
  return failures ? 1 : 0;
}
