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
  CHECK(double((fused - reference).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>()) <= bound * double(reference.cwiseAbs().maxCoeff()));
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

TEST_CASE("per-head inputs and the adjoint: absorbed decoding's two products against their definitions", "[kernel][mla]") {
  // bd_project_heads_into: head h reads its own block z_h of z and equals the projection of z_h
  // alone; bd_adjoint_heads: out_h·z_hᵀ = q_h·(z_h[S_h] + z_h[R_h]·C_h)ᵀ for every z_h, i.e. out_h
  // is q_h·[I; C_h]ᵀ placed at S_h and R_h. Shared windows and per-head pivoted bases, query heads
  // sharing a head of C (GQA), on every instruction set.
  bd_test::for_each_isa([&] {
    const Eigen::Index L = 5, d_in = 24, d = 6, heads = 4;
    for (const HeadIndices& idx : {HeadIndices::window(d_in, d, 8, heads), pivoted(d_in, d, heads)}) {
      const Eigen::MatrixXd z = bd_test::gaussian(L, heads * d_in, 11);
      const Eigen::MatrixXd C = bd_test::gaussian(d_in - d, heads * d, 12);
      Eigen::MatrixXd out(L, heads * d);
      bd::nn::bd_project_heads_into<double>(z, idx, C, out);
      for (Eigen::Index h = 0; h < heads; ++h) {
        const Eigen::MatrixXd z_h = z.middleCols(h * d_in, d_in);
        const Eigen::MatrixXd alone = bd::nn::bd_project_reference<double>(z_h, idx, C).middleCols(h * d, d);
        CHECK((out.middleCols(h * d, d) - alone).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() <= 1e-13 * alone.cwiseAbs().maxCoeff());
      }
      for (const Eigen::Index n_q : {heads, 2 * heads}) {  // one query head per head of C, or two
        const Eigen::MatrixXd q = bd_test::gaussian(L, n_q * d, 13);
        const Eigen::MatrixXd adj = bd::nn::bd_adjoint_heads<double>(q, n_q, idx, C);
        REQUIRE(adj.cols() == n_q * d_in);
        const Eigen::MatrixXd y = bd_test::gaussian(7, d_in, 14);  // any rows of a latent
        const Eigen::MatrixXd projected = bd::nn::bd_project_reference<double>(y, idx, C);
        for (Eigen::Index h = 0; h < n_q; ++h) {
          const Eigen::Index k = h / (n_q / heads);
          const Eigen::MatrixXd lhs = adj.middleCols(h * d_in, d_in) * y.transpose();
          const Eigen::MatrixXd rhs = q.middleCols(h * d, d) * projected.middleCols(k * d, d).transpose();
          CHECK((lhs - rhs).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() <= 1e-12 * rhs.cwiseAbs().maxCoeff());
        }
      }
      BD_CHECK_THROWS_CONTAINING(bd::nn::bd_project_heads_into<double>(z.leftCols(d_in), idx, C, out), bd::ShapeError,
                                 Contains("heads·input_dim = 96"));
      BD_CHECK_THROWS_CONTAINING(bd::nn::bd_adjoint_heads<double>(Eigen::MatrixXd(L, 3 * d), 3, idx, C), bd::ShapeError,
                                 Contains("3 query heads over 4 heads"));
    }
  });
}
