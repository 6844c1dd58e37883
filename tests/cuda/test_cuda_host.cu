// The CUDA projection's argument checks, on the host: no GPU needed, so these run wherever nvcc
// builds the CUDA header (ctest label cuda-host). Each refusal names what is wrong; each
// implementation's check() makes no device query, and can_implement/plan/run without a device
// say so instead of failing somewhere inside CUDA.
#include <bd/cuda/cublaslt_projection.cuh>
#include <bd/cuda/hopper_projection.cuh>
#include <bd/cuda/projection.cuh>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAILED", what.c_str());
  if (!ok) ++failures;
}

using Arguments = bd::cuda::ProjectionArguments<__half>;

// The checks read pointers only for null, alignment and overlap: stand-ins, never dereferenced.
// x is 4 × 64 halves (512 bytes), coeff 48 × 32 (3072 bytes), out 4 × 32 (256 bytes), apart.
__half* fake(std::uintptr_t address) { return reinterpret_cast<__half*>(address); }

Arguments valid() {
  Arguments a;
  a.x = fake(0x10000), a.coeff = fake(0x20000), a.out = fake(0x30000);
  a.rows = 4, a.input_dim = 64, a.head_dim = 16, a.heads = 2, a.window_offset = 8;
  return a;
}

struct Refusal {
  const char* what;                     // the case
  std::function<void(Arguments&)> bad;  // how it spoils valid()
  const char* needle;                   // what the message must say
};

}  // namespace

int main() {
  expect(bd::cuda::BDProjection<__half>::check(valid()).ok(), "valid arguments accepted");
  const Refusal refusals[] = {
      {"window offset near INT_MAX (offset + d_h overflows int)", [](Arguments& a) { a.window_offset = INT_MAX - 7; }, "outside"},
      {"window past the end", [](Arguments& a) { a.window_offset = 56; }, "outside"},
      {"negative window offset", [](Arguments& a) { a.window_offset = -8; }, "outside"},
      {"offset not a multiple of 8", [](Arguments& a) { a.window_offset = 4; }, "multiples of 8"},
      {"input_dim not a multiple of 8", [](Arguments& a) { a.input_dim = 60; }, "multiples of 8"},
      {"head_dim not a multiple of 8", [](Arguments& a) { a.head_dim = 12, a.window_offset = 0; }, "multiples of 8"},
      {"negative rows", [](Arguments& a) { a.rows = -1; }, "rows"},
      {"zero heads", [](Arguments& a) { a.heads = 0; }, "heads"},
      {"zero head_dim", [](Arguments& a) { a.head_dim = 0; }, "head_dim"},
      {"head_dim over input_dim", [](Arguments& a) { a.head_dim = 72; }, "exceeds"},
      {"heads·head_dim past 32 bits",
       [](Arguments& a) { a.input_dim = INT_MAX / 8 * 8, a.head_dim = 1 << 16, a.heads = 1 << 15, a.window_offset = 0; }, "32-bit"},
      {"misaligned x", [](Arguments& a) { a.x = fake(0x10002); }, "16-byte aligned"},
      {"misaligned coeff", [](Arguments& a) { a.coeff = fake(0x20008); }, "16-byte aligned"},
      {"null out", [](Arguments& a) { a.out = nullptr; }, "null"},
      {"null coeff with rest channels", [](Arguments& a) { a.coeff = nullptr; }, "null"},
      {"out overlapping x's last row", [](Arguments& a) { a.out = fake(0x10000 + 512 - 16); }, "out overlaps x"},
      {"out starting inside coeff", [](Arguments& a) { a.out = fake(0x20000 + 3072 - 16); }, "out overlaps coeff"},
      {"coeff starting inside out", [](Arguments& a) { a.coeff = fake(0x30000 + 240); }, "out overlaps coeff"},
      {"more row tiles than the grid's 65535",  // out placed far away: x and out are each over 500 MB
       [](Arguments& a) { a.rows = 128 * 65535 + 1, a.out = fake(std::uintptr_t(1) << 40); }, "65535"},
  };
  for (const Refusal& r : refusals) {
    Arguments a = valid();
    r.bad(a);
    const bd::cuda::Status s = bd::cuda::BDProjection<__half>::check(a);
    expect(!s.ok() && s.message().find(r.needle) != std::string::npos && s.message().find("BDProjection") == 0,
           std::string(r.what) + " refused: " + s.message());
  }

  // Edge cases that must pass.
  Arguments a = valid();
  a.rows = 0, a.out = nullptr;
  expect(bd::cuda::BDProjection<__half>::check(a).ok(), "zero rows need no buffers");
  a = valid(), a.out = fake(0x10000 + 512);  // right after x: adjacent, not overlapping
  expect(bd::cuda::BDProjection<__half>::check(a).ok(), "out adjacent to x accepted");
  a = valid(), a.input_dim = 16, a.window_offset = 0, a.coeff = nullptr;
  expect(bd::cuda::BDProjection<__half>::check(a).ok(), "the window is all of X: no coefficients needed");
  a = valid(), a.rows = 128 * 65535, a.out = fake(std::uintptr_t(1) << 40);
  expect(bd::cuda::BDProjection<__half>::check(a).ok(), "exactly 65535 row tiles accepted by the kernel");
  expect(bd::cuda::CublasBDProjection<__half>::check(a).ok() &&
             bd::cuda::CublasLtBDProjection<__half>::check(valid()).ok(),
         "the cuBLAS paths have no grid limit on rows");
  {
    Arguments bad = valid();
    bad.window_offset = 4;
    const bd::cuda::Status s = bd::cuda::CublasLtBDProjection<__half>::check(bad);
    expect(!s.ok() && s.message().find("CublasLtBDProjection") == 0, "each implementation names itself: " + s.message());
  }

  // The sm_90a kernel: its own shapes on top of the shared checks, each refusal naming itself.
  {
    using Hopper = bd::cuda::HopperBDProjection<__half>;
    Arguments h = valid();
    h.input_dim = 512, h.head_dim = 128, h.heads = 3, h.window_offset = 256;
    h.x = fake(0x100000), h.coeff = fake(0x200000), h.out = fake(0x400000);
    expect(Hopper::check(h).ok(), "hopper: DeepSeek's shape, middle window accepted: " + Hopper::check(h).message());
    const std::pair<const char*, std::function<void(Arguments&)>> bad[] = {
        {"window not a multiple of 64", [](Arguments& a) { a.window_offset = 200; }},
        {"head_dim 96", [](Arguments& a) { a.head_dim = 96; }},
        {"input_dim not a multiple of 64", [](Arguments& a) { a.input_dim = 520; }},
        {"no rest channels", [](Arguments& a) { a.input_dim = 128, a.window_offset = 0; }},
    };
    for (const auto& [what, spoil] : bad) {
      Arguments b = h;
      spoil(b);
      const bd::cuda::Status s = Hopper::check(b);
      expect(!s.ok() && s.message().find("HopperBDProjection") == 0 && s.message().find("multiples of 64") != std::string::npos,
             std::string("hopper: ") + what + " refused: " + s.message());
    }
    Arguments b = h;
    b.window_offset = 4;  // the shared checks come first
    const bd::cuda::Status s = Hopper::check(b);
    expect(!s.ok() && s.message().find("multiples of 8") != std::string::npos, "hopper: the shared checks first: " + s.message());
    Hopper hopper;
    const bd::cuda::Status unplanned_h = hopper.run(h);
    expect(!unplanned_h.ok() && unplanned_h.message().find("plan()") != std::string::npos,
           "hopper: run() before plan() refused: " + unplanned_h.message());
    if (bd::cuda::DeviceInfo::current().capability != 90) {
      const bd::cuda::Status c = hopper.can_implement(h);
      expect(!c.ok() && (c.message().find("no CUDA device") != std::string::npos || c.message().find("9.0") != std::string::npos),
             "hopper: a device other than sm_90 named: " + c.message());
    }
  }

  // Without a device (this is the host test's usual machine), the device-dependent entry points
  // say so; with one, a run() before plan() is refused by name.
  const bd::cuda::DeviceInfo device = bd::cuda::DeviceInfo::current();
  bd::cuda::CublasLtBDProjection<__half> lt(nullptr, nullptr, 0);
  const bd::cuda::Status unplanned = lt.run(valid());
  expect(!unplanned.ok() && unplanned.message().find("plan()") != std::string::npos, "run() before plan() refused: " + unplanned.message());
  if (!device.present()) {
    const bd::cuda::Status s = bd::cuda::BDProjection<__half>().can_implement(valid());
    expect(!s.ok() && s.message().find("no CUDA device") != std::string::npos, "no device: " + s.message());
    const bd::cuda::Status p = lt.plan(valid());
    expect(!p.ok() && p.message().find("no CUDA device") != std::string::npos, "no device, plan(): " + p.message());
  } else {
    std::printf("a CUDA device is present (compute capability %s): the no-device checks are not exercised here\n",
                device.capability_text().c_str());
  }

  std::printf(failures ? "%d check(s) FAILED\n" : "all argument checks passed\n", failures);
  return failures ? 1 : 0;
}
