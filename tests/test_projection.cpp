// The fused, blocked, multithreaded BD projection equals the plain Eigen expression
// z[:, S_h] + z[:, R_h]·C_h for every window position, odd L, L below one tile, head counts that
// do not fill a column block, depths split into several passes, per-head bases, narrow
// coefficient storage, float and double activations, 1 and 2 threads — on every kernel
// instruction set this CPU runs (portable, AVX2, AVX-512; the others are reported as skipped).
#include <bd/nn/projection.hpp>

#include "support.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

using Catch::Contains;
using bd::nn::HeadIndices;
using bd::kernel::Blocking;

namespace {

// Both sides sum the same fp32 products in different orders: |error| ≤ (d_in)·u·Σ|z||C|, far
// below 1e-5 relative to the output's scale for these sizes and unit-scale entries.
constexpr double kBound = 1e-5;

template <typename S, typename A = float>
Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic> check(Eigen::Index L, Eigen::Index d_in, Eigen::Index d, Eigen::Index heads, const HeadIndices& idx,
           const Blocking& blocking, unsigned seed) {
  using MatA = Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic>;
  const MatA z = bd_test::gaussian(L, d_in, seed).cast<A>();
  const Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic> C =
      bd_test::gaussian(d_in - d, heads * d, seed + 1).cast<A>().template cast<S>();
  const MatA fused = bd::nn::bd_project<A>(z, idx, C, blocking);
  const MatA reference = bd::nn::bd_project_reference<A>(z, idx, C);
  INFO("L " << L << ", d_in " << d_in << ", d " << d << ", heads " << heads << ", offset " << idx.offset << ", shared "
            << idx.shared << ", blocking " << blocking.mc << "x" << blocking.kc << "x" << blocking.nc);
  const double bound = std::is_same_v<A, float> ? kBound : 1e-13;  // the same argument with double's u
  CHECK(double((fused - reference).cwiseAbs().maxCoeff()) <= bound * double(reference.cwiseAbs().maxCoeff()));
  return fused;
}

HeadIndices pivoted(Eigen::Index d_in, Eigen::Index d, Eigen::Index heads) {
  std::vector<std::vector<Eigen::Index>> basis;
  for (Eigen::Index h = 0; h < heads; ++h) {
    std::vector<Eigen::Index> s;
    for (Eigen::Index k = 0; k < d; ++k) s.push_back((h * 5 + k * 7) % d_in);
    std::sort(s.begin(), s.end());
    basis.push_back(s);
  }
  return HeadIndices::from_basis(basis, d_in);
}

}  // namespace

TEST_CASE("fused projection: every window position, odd L, partial tiles", "[kernel]") {
  bd_test::for_each_isa([&] {
    const Eigen::Index d_in = 40, d = 8, heads = 5;
    for (Eigen::Index o = 0; o + d <= d_in; ++o)
      for (Eigen::Index L : {1, 7, 33, 64})
        check<float>(L, d_in, d, heads, HeadIndices::window(d_in, d, o, heads), Blocking{16, 256, 24}, unsigned(o + L));
  });
}

TEST_CASE("fused projection: n·d_h not a multiple of the column block, L below one row tile", "[kernel]") {
  bd_test::for_each_isa([&] {
    for (Eigen::Index heads : {1, 3, 7})
      check<float>(5, 64, 16, heads, HeadIndices::window(64, 16, 16, heads), Blocking{128, 256, 48}, 3);
    check<float>(200, 96, 32, 5, HeadIndices::window(96, 32, 64, 5), Blocking{64, 256, 64}, 4);  // window at the end
  });
}

TEST_CASE("fused projection: per-head pivoted bases gather their own channels", "[kernel]") {
  bd_test::for_each_isa([&] {
    const HeadIndices idx = pivoted(48, 6, 6);
    REQUIRE_FALSE(idx.shared);
    for (Eigen::Index L : {1, 19, 70}) check<float>(L, 48, 6, 6, idx, Blocking{32, 256, 12}, unsigned(L));
    // Head widths that leave a partial micro-panel, heads grouped into blocks, several passes.
    const HeadIndices wide = pivoted(61, 13, 7);
    REQUIRE_FALSE(wide.shared);
    for (Eigen::Index L : {17, 50}) check<float>(L, 61, 13, 7, wide, Blocking{16, 9, 40}, unsigned(L) + 1);
  });
}

TEST_CASE("fused projection: depth split into passes, double activations", "[kernel]") {
  bd_test::for_each_isa([&] {
    for (Eigen::Index o : {0, 5, 24})
      check<float>(45, 40, 16, 3, HeadIndices::window(40, 16, o, 3), Blocking{16, 5, 24}, unsigned(o) + 40);
    check<double, double>(45, 40, 16, 3, HeadIndices::window(40, 16, 7, 3), Blocking{16, 5, 24}, 50);
    check<double, double>(33, 61, 13, 7, pivoted(61, 13, 7), Blocking{}, 51);
  });
}

TEST_CASE("fused projection: half and bfloat16 coefficients, converted per column block", "[kernel]") {
  bd_test::for_each_isa([&] {
    check<Eigen::half>(37, 64, 8, 9, HeadIndices::window(64, 8, 24, 9), Blocking{16, 256, 32}, 5);
    check<Eigen::bfloat16>(37, 64, 8, 9, HeadIndices::window(64, 8, 56, 9), Blocking{16, 256, 32}, 6);
  });
}

TEST_CASE("fused projection: one thread and two threads give the same result", "[kernel][threads]") {
  // Each output tile is one thread's, summed in the same order whatever the thread count: the
  // results agree to the bit.
  bd_test::for_each_isa([&] {
    const auto project = [] {
      return check<float>(130, 64, 16, 6, HeadIndices::window(64, 16, 32, 6), Blocking{32, 256, 32}, 7);
    };
#ifdef _OPENMP
    const int before = omp_get_max_threads();
    omp_set_num_threads(1);
    const Eigen::MatrixXf one = project();
    omp_set_num_threads(2);
    const Eigen::MatrixXf two = project();
    omp_set_num_threads(before);
    CHECK(one == two);
#else
    WARN("built without OpenMP: one thread only");
    project();
#endif
  });
}

TEST_CASE("fused projection: shapes that disagree throw ShapeError, naming them, in every build", "[kernel]") {
  const HeadIndices idx = HeadIndices::window(16, 4, 4, 3);  // d_in 16, d_h 4, offset 4, 3 heads
  const Eigen::MatrixXf z = Eigen::MatrixXf::Ones(5, 16), C = Eigen::MatrixXf::Ones(12, 12);
  Eigen::MatrixXf out(5, 12);
  CHECK_NOTHROW(bd::nn::bd_project_into<float>(z, idx, C, out));
  const Eigen::MatrixXf z_wide = Eigen::MatrixXf::Ones(5, 17), C_short = Eigen::MatrixXf::Ones(11, 12);
  Eigen::MatrixXf out_narrow(5, 11), out_short(4, 12);
  BD_CHECK_THROWS_CONTAINING(bd::nn::bd_project_into<float>(z_wide, idx, C, out), bd::ShapeError,
                             Catch::Contains("z is 5x17"));
  BD_CHECK_THROWS_CONTAINING(bd::nn::bd_project_into<float>(z, idx, C_short, out), bd::ShapeError, Contains("C 11x12"));
  BD_CHECK_THROWS_CONTAINING(bd::nn::bd_project_into<float>(z, idx, C, out_narrow), bd::ShapeError,
                             Contains("out 5x11"));
  BD_CHECK_THROWS_CONTAINING(bd::nn::bd_project_into<float>(z, idx, C, out_short), bd::ShapeError,
                             Contains("out 4x12"));
}
