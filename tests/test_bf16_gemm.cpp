// bf16 compute (arguments.hpp's Compute::BF16): bd::kernel::gemm rounds X and B to bfloat16 once,
// as it packs them, and sums their products in float.
//   - Exact where exactness is possible: small integers, whose every product and partial sum a
//     float holds, give the exact product in any order, on every path.
//   - The same bits on every instruction set and both bf16 methods (vdpbf16ps where the CPU has
//     it, FMAs on the rounded operands elsewhere): vdpbf16ps adds a pair's odd product, then its
//     even one, each rounded once, and the FMA path packs each pair swapped; a bf16 product is
//     exact in float, so even a separate multiply and add rounds as an FMA.
//   - Within (depth + 1)·2⁻²⁴·(Σ|x·b| + |start|) of the product of the rounded operands in double
//     (the forward bound of a float sum of depth terms and a start), and no blocking moves a bit.
//   - A product that cannot compute in bf16 (double arithmetic, f16-stored weights) is refused.
// Values stay far from bf16's subnormals, which vdpbf16ps flushes to zero and the FMAs keep.
#include <bd/kernel/context.hpp>
#include <bd/kernel/gemm.hpp>

#include <numeric>
#include <random>

#include "support.hpp"

using bd::kernel::Blocking;
using bd::kernel::Compute;
using bd::kernel::Isa;
using Catch::Contains;
using Eigen::Index;
using Eigen::MatrixXd;
using Eigen::MatrixXf;

namespace {

float bf16_rounded(float x) { return static_cast<float>(Eigen::bfloat16(x)); }

/// The shapes of a layer's products: a gathered segment (channels out of order, a window's two
/// runs), basis starts, a bias or accumulation, scattered output columns, B column- or row-major.
struct Case {
  Index L, K, N;
  bool init = false, bias = false, accumulate = false, scatter = false, b_row_major = false;
};

template <typename S>
struct Product {
  Case c;
  MatrixXf X;                           // L × (K + 8)
  Eigen::Matrix<S, -1, -1> B;           // K × N, or N × K read transposed
  std::vector<Index> channels, init, columns;
  Eigen::VectorXf bias;
  MatrixXf start;                       // the output's values before (accumulate)

  Product(const Case& cs, const MatrixXf& x, const MatrixXf& b) : c(cs), X(x) {
    B = (c.b_row_major ? MatrixXf(b.transpose()) : b).template cast<S>();
    for (Index k = 0; k < c.K; ++k) channels.push_back((k * 5 + 3) % (c.K + 8));  // a permutation of part of X
    for (Index j = 0; j < c.N; ++j) init.push_back((j * 3) % (c.K + 8)), columns.push_back(2 * j + 1);
    bias = MatrixXd(bd_test::gaussian(c.N, 1, 7)).cast<float>();
    start = MatrixXd(bd_test::gaussian(c.L, 2 * c.N + 1, 8)).cast<float>();
  }

  MatrixXf run(Compute compute, const Blocking& blk = {}, int threads = 0) const {
    MatrixXf out = start;
    bd::kernel::GemmArguments<float, S> a;
    a.rows = c.L, a.x = X.data(), a.ldx = X.rows();
    a.b = B.data(), a.ldb = B.rows(), a.b_row_major = c.b_row_major;
    a.out = out.data(), a.ldo = out.rows();
    a.out_columns = c.scatter ? columns.data() : nullptr;
    a.init_channels = c.init ? init.data() : nullptr;
    a.init_values = c.bias ? bias.data() : nullptr;
    a.accumulate = c.accumulate;
    a.segments.push_back({channels.data(), c.K, 0, c.N});
    a.compute = compute;
    bd::kernel::gemm(a, blk, threads);
    return out;
  }

  /// The product of the rounded operands in double, and each output's Σ|x·b| + |start|.
  void reference(MatrixXd& exact, MatrixXd& magnitude) const {
    exact = start.cast<double>(), magnitude = MatrixXd::Zero(start.rows(), start.cols());
    for (Index j = 0; j < c.N; ++j) {
      const Index col = c.scatter ? columns[std::size_t(j)] : j;
      for (Index i = 0; i < c.L; ++i) {
        double s0 = c.accumulate ? double(start(i, col)) : c.init ? double(X(i, init[std::size_t(j)])) : c.bias ? double(bias(j)) : 0.0;
        double sum = s0, mag = std::abs(s0);
        for (Index k = 0; k < c.K; ++k) {
          const double x = bf16_rounded(X(i, channels[std::size_t(k)]));
          const double b = bf16_rounded(static_cast<float>(c.b_row_major ? B(j, k) : B(k, j)));
          sum += x * b, mag += std::abs(x * b);
        }
        exact(i, col) = sum, magnitude(i, col) = mag;
      }
    }
  }
};

const Case cases[] = {
    {1, 37, 19},                                    // one token: the skinny path
    {3, 64, 70, true},                              // a few: skinny, basis starts
    {1, 2600, 9},                                   // one token deeper than Tuning::row_walk
    {5, 37, 19, false, true},                       // the packed path from here: odd depth, a bias
    {70, 385, 53, true, false, false, true},        // odd depth over several passes, scattered columns
    {33, 200, 29, false, false, true, false, true}, // accumulate, B read transposed
    {129, 96, 130, true},
};

}  // namespace

TEST_CASE("bf16 gemm: small integers give the exact product on every path", "[kernel][bf16]") {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> small(-8, 8);
  for (const Case& c : cases) {
    // Products ≤ 64, sums ≤ 64·2600 + 8: every partial sum an integer a float holds exactly.
    MatrixXf x(c.L, c.K + 8), b(c.K, c.N);
    for (Index i = 0; i < x.size(); ++i) x.data()[i] = float(small(rng));
    for (Index i = 0; i < b.size(); ++i) b.data()[i] = float(small(rng));
    Case integer = c;
    integer.bias = integer.accumulate = false;  // their starts are not integers
    const Product<float> p(integer, x, b);
    const Product<Eigen::bfloat16> stored(integer, x, b);
    MatrixXd exact, magnitude;
    p.reference(exact, magnitude);
    INFO(c.L << " × " << c.K << " × " << c.N);
    bd_test::for_each_bf16_path([&] {
      CHECK(p.run(Compute::BF16).cast<double>() == exact);
      CHECK(stored.run(Compute::BF16).cast<double>() == exact);
      CHECK(p.run(Compute::BF16, {}, 1).cast<double>() == exact);
    });
  }
}

TEST_CASE("bf16 gemm: the product of the rounded operands within the float sum's bound, the same bits on every path",
          "[kernel][bf16]") {
  for (const Case& c : cases) {
    const MatrixXf x = bd_test::gaussian(c.L, c.K + 8, unsigned(c.K)).cast<float>();
    const MatrixXf b = bd_test::gaussian(c.K, c.N, unsigned(c.N)).cast<float>();
    const Product<float> p(c, x, b);
    const Product<Eigen::bfloat16> stored(c, x, b);
    MatrixXd exact, magnitude;
    p.reference(exact, magnitude);
    const double u = std::ldexp(1.0, -24);
    INFO(c.L << " × " << c.K << " × " << c.N);
    std::vector<MatrixXf> packed;  // the packed path's outputs, one per ISA and method
    bd_test::for_each_bf16_path([&] {
      const MatrixXf got = p.run(Compute::BF16);
      const MatrixXd excess = (got.cast<double>() - exact).cwiseAbs() - (double(c.K) + 1) * u * magnitude;
      CHECK(excess.maxCoeff<Eigen::PropagateNaN>() <= 0.0);
      // B stored in bf16 holds the rounded values: the same product.
      CHECK(stored.run(Compute::BF16) == got);
      CHECK(p.run(Compute::BF16, {}, 1) == got);
      // Rounding changes the product: f32 compute differs (a test that cannot tell them apart
      // would pass a kernel that ignores the request).
      CHECK(p.run(Compute::F32) != got);
      if (c.L > bd::kernel::skinny_rows) packed.push_back(got);
    });
    for (const MatrixXf& other : packed) CHECK(other == packed.front());
  }
}

TEST_CASE("bf16 gemm: no blocking moves a bit (pairs never straddle two passes)", "[kernel][bf16]") {
  const Case c{70, 385, 53, true};
  const Product<float> p(c, bd_test::gaussian(70, 393, 11).cast<float>(), bd_test::gaussian(385, 53, 12).cast<float>());
  bd_test::for_each_bf16_path([&] {
    const MatrixXf whole = p.run(Compute::BF16);
    for (const Blocking& blk : {Blocking{16, 1, 12}, Blocking{32, 7, 24}, Blocking{48, 64, 36}, Blocking{0, 129, 0}})
      CHECK(p.run(Compute::BF16, blk) == whole);
  });
}

TEST_CASE("bf16 gemm: segments give each its own product's bits however their channels pair", "[kernel][bf16]") {
  // Three segments (a layer's heads) of depth 37 (an odd last half) over X's 41 channels: the
  // second pairs its channels as the first does, the third either starts pairs on the others'
  // seconds (pairs that coexist) or pairs a channel with another partner than the first does
  // (pairs that cannot share a copy). Every segment's outputs equal its product alone, bit for
  // bit, on every path, and the double product of the rounded operands within the sum's bound.
  const Index L = 70, K = 37, C = 41;
  const Index widths[3] = {13, 26, 9};
  const MatrixXf x = bd_test::gaussian(L, C, 21).cast<float>();
  const MatrixXf b = bd_test::gaussian(K, 48, 22).cast<float>();
  std::vector<Index> first(K), shifted(K), crossed(K);
  std::iota(first.begin(), first.end(), Index(2));                                       // 2, 3, …: pairs (2, 3), (4, 5), …
  std::iota(shifted.begin(), shifted.end(), Index(3));                                   // (3, 4), (5, 6), …
  const Index swap[4] = {0, 2, 1, 3};
  for (Index k = 0; k < K; ++k) crossed[std::size_t(k)] = 2 + k / 4 * 4 + swap[k % 4];  // (2, 4), (3, 5), …
  for (const auto* third : {&shifted, &crossed}) {
    const std::vector<Index>* lists[3] = {&first, &first, third};
    MatrixXf out(L, 48);
    bd::kernel::GemmArguments<float, float> a;
    a.rows = L, a.x = x.data(), a.ldx = L, a.b = b.data(), a.ldb = K, a.out = out.data(), a.ldo = L;
    for (Index s = 0, c0 = 0; s < 3; c0 += widths[s], ++s) a.segments.push_back({lists[s]->data(), K, c0, widths[s]});
    a.compute = Compute::BF16;
    INFO((third == &shifted ? "pairs that coexist" : "pairs that cannot share a copy"));
    std::vector<MatrixXf> all;
    bd_test::for_each_bf16_path([&] {
      bd::kernel::gemm(a);
      for (Index s = 0, c0 = 0; s < 3; c0 += widths[s], ++s) {
        MatrixXf alone(L, widths[s]);
        bd::kernel::GemmArguments<float, float> one = a;
        one.b = b.data() + c0 * K, one.out = alone.data(), one.segments = {};
        one.segments.push_back({lists[s]->data(), K, 0, widths[s]});
        bd::kernel::gemm(one);
        CHECK(out.middleCols(c0, widths[s]) == alone);
        MatrixXd exact = MatrixXd::Zero(L, widths[s]), magnitude = exact;
        for (Index j = 0; j < widths[s]; ++j)
          for (Index k = 0; k < K; ++k)
            for (Index i = 0; i < L; ++i) {
              const double p = double(bf16_rounded(x(i, (*lists[s])[std::size_t(k)]))) * bf16_rounded(b(k, c0 + j));
              exact(i, j) += p, magnitude(i, j) += std::abs(p);
            }
        const MatrixXd excess = (alone.cast<double>() - exact).cwiseAbs() - (double(K) + 1) * std::ldexp(1.0, -24) * magnitude;
        CHECK(excess.maxCoeff<Eigen::PropagateNaN>() <= 0.0);
      }
      all.push_back(out);
    });
    for (const MatrixXf& other : all) CHECK(other == all.front());
  }
}

TEST_CASE("bf16 gemm: a product that cannot compute in bf16 is refused by name", "[kernel][bf16]") {
  MatrixXd x = MatrixXd::Ones(8, 4), b = MatrixXd::Ones(4, 3), out(8, 3);
  std::vector<Index> channels{0, 1, 2, 3};
  bd::kernel::GemmArguments<double, double> d;
  d.rows = 8, d.x = x.data(), d.ldx = 8, d.b = b.data(), d.ldb = 4, d.out = out.data(), d.ldo = 8;
  d.segments.push_back({channels.data(), 4, 0, 3});
  d.compute = Compute::BF16;
  BD_CHECK_THROWS_CONTAINING(bd::kernel::gemm(d), bd::RangeError, Contains("this product's arithmetic is f64"));
  MatrixXf xf = MatrixXf::Ones(8, 4), of(8, 3);
  Eigen::Matrix<Eigen::half, -1, -1> bh = MatrixXf::Ones(4, 3).cast<Eigen::half>();
  bd::kernel::GemmArguments<float, Eigen::half> h;
  h.rows = 8, h.x = xf.data(), h.ldx = 8, h.b = bh.data(), h.ldb = 4, h.out = of.data(), h.ldo = 8;
  h.segments.push_back({channels.data(), 4, 0, 3});
  h.compute = Compute::BF16;
  BD_CHECK_THROWS_CONTAINING(bd::kernel::gemm(h), bd::RangeError, Contains("would round them twice"));
}
