// bd::kernel::gemm equals the plain Eigen expression it replaces,
//     out[:, col(c)] = init(c) + X[:, chan]·B[:, c],
// for every edge the blocking creates: rows not a multiple of the micro-tile (odd L, L below
// one tile), widths not a multiple of NR, depths split into several passes or empty, segments
// that share a column block, scattered output columns, bias and channel starts, narrow B,
// float and double, 1 and 2 threads — on every micro-kernel this CPU runs (portable, AVX2,
// AVX-512, each forced in turn; one the CPU lacks is reported as skipped). CI also compiles this
// file with -march=x86-64-v4, where Eigen's own reference products use AVX-512.
#include <numeric>

#include <bd/kernel/gemm.hpp>

#include "allocation_counter.hpp"
#include "support.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

#define BD_KERNEL_TEST_TAG "[kernel]"

namespace {

using bd::kernel::Blocking;
using bd::kernel::Index;
using bd::kernel::Segment;

template <typename T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;

// Both sides sum the same products in different orders: |error| ≤ depth·u·Σ|x||b| plus the
// start value's rounding; with unit Gaussian entries and depth ≤ 100 that is below 64·depth·u
// relative to the output's largest entry.
template <typename T>
double bound(Index depth) {
  return 64.0 * double(std::max<Index>(depth, 1)) * double(Eigen::NumTraits<T>::epsilon());
}

std::vector<Index> channels_of(Index first, Index count, Index stride = 1) {
  std::vector<Index> c;
  for (Index k = 0; k < count; ++k) c.push_back(first + k * stride);
  return c;
}

/// One segment over all of B's columns, reading X's channels `chan`, starting from `init`
/// (channels of X) or `bias`, written to `cols` of an output wider than B; B stored row-major
/// (its transpose read in place) with `b_row_major`.
template <typename T, typename S>
void check(Index L, const std::vector<Index>& chan, Index N, const Blocking& blk, unsigned seed,
           const std::vector<Index>* init = nullptr, bool bias = false, const std::vector<Index>* cols = nullptr,
           bool b_row_major = false) {
  const Index K = static_cast<Index>(chan.size()), x_width = 2 * K + 3, out_width = cols ? 2 * N + 1 : N;
  const Mat<T> X = bd_test::gaussian(L, x_width, seed).cast<T>();
  const Mat<S> B = bd_test::gaussian(K, N, seed + 1).cast<T>().template cast<S>();
  const Eigen::Matrix<T, Eigen::Dynamic, 1> b = bd_test::gaussian(N, 1, seed + 2).cast<T>();
  Mat<T> out = Mat<T>::Constant(L, out_width, T(7));  // columns the kernel must not touch keep 7
  Mat<T> expected = out;
  Mat<T> reference = X(Eigen::all, chan) * B.template cast<T>();
  for (Index c = 0; c < N; ++c) {
    if (init) reference.col(c) += X.col((*init)[std::size_t(c)]);
    if (bias) reference.col(c).array() += b[c];
    expected.col(cols ? (*cols)[std::size_t(c)] : c) = reference.col(c);
  }
  const Mat<S> Bt = B.transpose();  // B(k, c) at Bt.data()[k·N + c]
  bd::kernel::GemmArguments<T, S> a;
  a.rows = L;
  a.x = X.data(), a.ldx = X.outerStride();
  a.b = b_row_major ? Bt.data() : B.data(), a.ldb = b_row_major ? Bt.outerStride() : B.outerStride();
  a.b_row_major = b_row_major;
  a.out = out.data(), a.ldo = out.outerStride();
  a.out_columns = cols ? cols->data() : nullptr;
  a.init_channels = init ? init->data() : nullptr;
  a.init_values = bias ? b.data() : nullptr;
  a.segments.push_back({chan.data(), K, 0, N});
  bd::kernel::gemm(a, blk);
  INFO("L " << L << ", K " << K << ", N " << N << ", tiles " << blk.mc << "x" << blk.kc << "x" << blk.nc
            << (b_row_major ? ", B row-major" : ""));
  const double scale = std::max(1.0, double(expected.cwiseAbs().maxCoeff()));
  // PropagateNaN in every error measure here: Eigen's default maximum may skip a NaN output.
  CHECK(double((out - expected).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>()) <= bound<T>(K) * scale);
}

}  // namespace

TEST_CASE("gemm kernel: dense product for odd rows, widths and depths", BD_KERNEL_TEST_TAG) {
  bd_test::for_each_isa([&] {
    for (Index L : {1, 5, 16, 17, 33, 100})
      for (Index N : {1, 4, 6, 7, 13, 40})
        for (Index K : {1, 3, 24, 50}) {
          check<float, float>(L, channels_of(0, K), N, Blocking{32, 16, 12}, unsigned(L * 131 + N * 7 + K));
          check<double, double>(L, channels_of(0, K), N, Blocking{16, 20, 18}, unsigned(L * 131 + N * 7 + K + 1));
        }
  });
}

TEST_CASE("gemm kernel: default blocking, several passes over a long depth", BD_KERNEL_TEST_TAG) {
  bd_test::for_each_isa([&] {
    check<float, float>(70, channels_of(0, 97), 50, Blocking{}, 11);
    check<float, float>(70, channels_of(0, 97), 50, Blocking{48, 10, 36}, 12);  // 10 passes of ≤ 10
    check<double, double>(45, channels_of(0, 97), 31, Blocking{8, 1, 6}, 13);   // one channel per pass
  });
}

TEST_CASE("gemm kernel: gathered channels, starts from channels or a bias, scattered columns", BD_KERNEL_TEST_TAG) {
  bd_test::for_each_isa([&] {
    const std::vector<Index> chan{5, 0, 9, 2, 11, 12, 3};  // any order, any channels of X
    const std::vector<Index> init{1, 4, 4, 6, 7, 8, 10, 13, 14, 16, 1};
    std::vector<Index> cols(init.size());
    for (std::size_t c = 0; c < cols.size(); ++c) cols[c] = Index(2 * c + 1) % 23;  // a permutation's image
    for (Index L : {3, 16, 37}) {
      check<float, float>(L, chan, 11, Blocking{16, 4, 6}, unsigned(L), &init);
      check<float, float>(L, chan, 11, Blocking{16, 4, 6}, unsigned(L) + 1, nullptr, true);
      check<float, float>(L, chan, 11, Blocking{16, 4, 6}, unsigned(L) + 2, &init, false, &cols);
      check<double, double>(L, chan, 11, Blocking{8, 3, 4}, unsigned(L) + 3, nullptr, true, &cols);
    }
  });
}

TEST_CASE("gemm kernel: an empty depth writes the start values alone", BD_KERNEL_TEST_TAG) {
  bd_test::for_each_isa([&] {
    const std::vector<Index> init{2, 0, 1};
    check<float, float>(19, {}, 3, Blocking{}, 21, &init);
    check<float, float>(19, {}, 3, Blocking{}, 22, nullptr, true);
  });
}

TEST_CASE("gemm kernel: half and bfloat16 B are converted while packing", BD_KERNEL_TEST_TAG) {
  bd_test::for_each_isa([&] {
    // B is rounded to S before the reference sees it, so only the summation order differs.
    check<float, Eigen::half>(29, channels_of(1, 20, 2), 15, Blocking{16, 8, 12}, 31);
    check<float, Eigen::bfloat16>(29, channels_of(1, 20, 2), 15, Blocking{16, 8, 12}, 32);
    check<double, float>(29, channels_of(1, 20, 2), 15, Blocking{16, 8, 12}, 33);
  });
}

TEST_CASE("gemm kernel: segments with their own channels share column blocks", BD_KERNEL_TEST_TAG) {
  bd_test::for_each_isa([&] {
    // Three segments of widths 5, 9, 4 reading different channels; nc = 12 puts the first two in
    // one block and splits nothing smaller than a block.
    const Index L = 41, width = 18;
    const std::vector<std::vector<Index>> chan{{0, 1, 2, 3}, {7, 5, 3, 1, 8}, {9}};
    const std::vector<Index> first{0, 5, 14}, widths{5, 9, 4};
    const Mat<float> X = bd_test::gaussian(L, 10, 41).cast<float>();
    const Mat<float> B = bd_test::gaussian(5, width, 42).cast<float>();
    for (Index nc : {6, 12, 100}) {
      Mat<float> out(L, width);
      bd::kernel::GemmArguments<float, float> a;
      a.rows = L, a.x = X.data(), a.ldx = L, a.b = B.data(), a.ldb = 5, a.out = out.data(), a.ldo = L;
      for (std::size_t s = 0; s < 3; ++s) a.segments.push_back({chan[s].data(), Index(chan[s].size()), first[s], widths[s]});
      bd::kernel::gemm(a, Blocking{16, 3, nc});
      for (std::size_t s = 0; s < 3; ++s) {
        const Index K = Index(chan[s].size());
        const Mat<float> expected = X(Eigen::all, chan[s]) * B.block(0, first[s], K, widths[s]);
        INFO("segment " << s << ", nc " << nc);
        CHECK((out.middleCols(first[s], widths[s]) - expected).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() <= bound<float>(K) * 10);
      }
    }
  });
}

TEST_CASE("gemm kernel: one thread and two threads agree bit for bit", BD_KERNEL_TEST_TAG "[threads]") {
  bd_test::for_each_isa([&] {
    // Every output element is summed by one thread in the same order whatever the thread count.
    const std::vector<Index> chan = channels_of(0, 60);
    const Mat<float> X = bd_test::gaussian(130, 60, 51).cast<float>();
    const Mat<float> B = bd_test::gaussian(60, 45, 52).cast<float>();
    Mat<float> one(130, 45), two(130, 45);
    for (int threads : {1, 2}) {
      bd::kernel::GemmArguments<float, float> a;
      a.rows = 130, a.x = X.data(), a.ldx = 130, a.b = B.data(), a.ldb = 60;
      a.out = (threads == 1 ? one : two).data(), a.ldo = 130;
      a.segments.push_back({chan.data(), 60, 0, 45});
      bd::kernel::gemm(a, Blocking{32, 24, 12}, threads);
    }
    CHECK(one == two);
    CHECK((one - X * B).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() <= bound<float>(60) * 10);
  });
}

/// X·B on the GEMM with `blocking`, X's columns in the order `chan` lists (all of them).
template <typename T>
Mat<T> plain_product(const Mat<T>& X, const Mat<T>& B, const std::vector<Index>& chan, const Blocking& blocking) {
  Mat<T> out(X.rows(), B.cols());
  bd::kernel::GemmArguments<T, T> a;
  a.rows = X.rows(), a.x = X.data(), a.ldx = X.rows(), a.b = B.data(), a.ldb = B.rows();
  a.out = out.data(), a.ldo = X.rows();
  a.segments.push_back({chan.data(), Index(chan.size()), 0, B.cols()});
  bd::kernel::gemm(a, blocking);
  return out;
}

TEST_CASE("gemm kernel: the rows per block fill at most half of L2 and change the time, not a bit of the result",
          BD_KERNEL_TEST_TAG) {
  bd_test::for_each_isa([&] {
    // The A block (mc × kc) within half of L2, at most 144 rows, more rows for a larger L2.
    for (long l2 : {256L << 10, 512L << 10, 1L << 20, 2L << 20}) {
      for (Index depth : {Index(0), Index(384), Index(512)}) {
        const Index mc_f = bd::kernel::default_row_block<float>(depth, l2);
        const Index mc_d = bd::kernel::default_row_block<double>(depth, l2);
        const Index kc_f = depth ? depth : bd::kernel::default_depth<float>(), kc_d = depth ? depth : bd::kernel::default_depth<double>();
        INFO("L2 " << l2 << ", depth " << depth << ": mc " << mc_f << " (float), " << mc_d << " (double)");
        CHECK(mc_f * kc_f * Index(sizeof(float)) <= l2 / 2);
        CHECK(mc_d * kc_d * Index(sizeof(double)) <= l2 / 2);
        const Index mc_max = bd::kernel::active_context().tuning.mc;
        CHECK((mc_f > 0 && mc_f <= mc_max && mc_d > 0 && mc_d <= mc_max));
        CHECK(mc_f <= bd::kernel::default_row_block<float>(depth, 2 * l2));
      }
    }
    // Half of L2 in whole tiles: double at 384 channels on 512 KiB, float at 512 on 256 KiB; the
    // tuning's mc (144 in every row of the table) on 1 MiB.
    CHECK(bd::kernel::default_row_block<double>(384, 512L << 10) == 80);
    CHECK(bd::kernel::default_row_block<float>(512, 256L << 10) == 64);
    CHECK(bd::kernel::default_row_block<float>(384, 1L << 20) == 144);
    // Blocks of 16, 80 and the CPU's rows: every output summed in the same order.
    const std::vector<Index> chan = channels_of(0, 384);
    const Mat<double> X = bd_test::gaussian(203, 384, 71);
    const Mat<double> B = bd_test::gaussian(384, 31, 72);
    std::vector<Mat<double>> outs;
    for (Index mc : {Index(0), Index(16), Index(80)}) outs.push_back(plain_product(X, B, chan, Blocking{mc, 0, 768}));
    CHECK(outs[0] == outs[1]);
    CHECK(outs[0] == outs[2]);
    CHECK((outs[0] - X * B).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() <= bound<double>(384) * 10);
  });
}

TEST_CASE("gemm kernel: the depth per pass changes the time, not a bit of the result", BD_KERNEL_TEST_TAG) {
  bd_test::for_each_isa([&] {
    // Depth 512: one pass of 512 on a large L1 (the default, depth_block), two of 256 or eight of
    // 64 when asked: a pass stores its accumulators and the next loads them, so every output is
    // summed in the same order.
    const std::vector<Index> chan = channels_of(0, 512);
    const Mat<float> X = bd_test::gaussian(37, 512, 61).cast<float>();
    const Mat<float> B = bd_test::gaussian(512, 29, 62).cast<float>();
    std::vector<Mat<float>> outs;
    for (Index kc : {Index(0), Index(384), Index(64)}) outs.push_back(plain_product(X, B, chan, Blocking{144, kc, 768}));
    CHECK(outs[0] == outs[1]);
    CHECK(outs[0] == outs[2]);
    CHECK((outs[0] - X * B).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() <= bound<float>(512) * 10);
  });
  // The chosen depth keeps BD's key projection (384) in one pass and stays within 512; a product
  // only a little deeper than the streamed passes allow takes at most one pass more, never a
  // pass longer than 512, and the streamed depth again past 512.
  bd_test::for_each_isa([&] {
    for (Index kc : {bd::kernel::default_depth<float>(), bd::kernel::default_depth<double>()}) {
      CHECK(kc >= 384);
      CHECK(kc <= 512);
    }
    for (Index depth : {Index(384), Index(448), Index(512), Index(513), Index(1638), Index(4096)}) {
      const Index kc = bd::kernel::default_depth<float>(depth), streamed = bd::kernel::default_depth<float>();
      CHECK(kc >= 384);
      CHECK(kc <= 512);
      CHECK((kc == streamed || kc == depth));
      if (depth > 512) CHECK(kc == streamed);
    }
  });
}

TEST_CASE("gemm kernel: a few rows (decoding) stream B unpacked with the same results", BD_KERNEL_TEST_TAG) {
  bd_test::for_each_isa([&] {
    // L ≤ skinny_rows takes the dot-product path, L = skinny_rows + 1 the packed one: both must
    // equal the reference for every kind of start, scattered columns and narrow B.
    const std::vector<Index> chan{5, 0, 9, 2, 11, 12, 3};
    const std::vector<Index> init{1, 4, 4, 6, 7, 8, 10, 13, 14, 16, 1};
    std::vector<Index> cols(init.size());
    for (std::size_t c = 0; c < cols.size(); ++c) cols[c] = Index(2 * c + 1) % 23;
    const std::vector<Index> empty_depth_init{2, 0, 1};  // X has 2·0 + 3 channels then
    for (Index L = 1; L <= bd::kernel::skinny_rows + 1; ++L) {
      check<float, float>(L, chan, 11, Blocking{16, 4, 6}, unsigned(L) + 60, &init);
      check<float, float>(L, chan, 11, Blocking{16, 4, 6}, unsigned(L) + 61, nullptr, true, &cols);
      check<double, double>(L, channels_of(0, 97), 11, Blocking{}, unsigned(L) + 62, &init, false, &cols);
      check<float, Eigen::half>(L, channels_of(1, 20, 2), 15, Blocking{}, unsigned(L) + 63);
      check<float, Eigen::bfloat16>(L, channels_of(1, 20, 2), 11, Blocking{}, unsigned(L) + 64, &init);
      check<float, float>(L, {}, 3, Blocking{}, unsigned(L) + 65, &empty_depth_init);
    }
  });
}

TEST_CASE("gemm kernel: a few rows (decoding) allocate nothing for shapes the workspace has seen", BD_KERNEL_TEST_TAG) {
  if (!bd_test::counts_allocations()) {
    WARN("built with AddressSanitizer, which owns operator new: allocations are counted in the Release build");
    return;
  }
  bd_test::for_each_isa([&] {
    // One token's projections: B column-major (dot_columns), narrow (each run converted into a
    // thread's buffer), row-major (a head's map read transposed: column_scores), over two segments
    // of their own channels and columns, wide enough to run on all threads. The first call sizes
    // the workspace's scratch; a token after it allocates nothing, and computes the same bits.
    const Index K = 256, D = K / 2, N = 600, W = N / 2;
    const std::vector<Index> low = channels_of(0, D), high = channels_of(D, D);
    const Mat<float> X = bd_test::gaussian(1, K, 71).cast<float>();
    const Mat<float> B = bd_test::gaussian(D, N, 72).cast<float>();  // both segments' rows 0..D-1
    const Mat<Eigen::half> H = B.cast<Eigen::half>();
    const Mat<float> Bt = B.transpose();
    Mat<float> out(1, N);
    const auto arguments = [&](const auto* b, Index ldb, bool row_major) {
      bd::kernel::GemmArguments<float, std::remove_const_t<std::remove_pointer_t<decltype(b)>>> a;
      a.rows = 1, a.x = X.data(), a.ldx = 1, a.b = b, a.ldb = ldb, a.b_row_major = row_major;
      a.out = out.data(), a.ldo = 1;
      a.segments.push_back({low.data(), D, 0, W});
      a.segments.push_back({high.data(), D, W, W});
      return a;
    };
    const auto column_major = arguments(B.data(), D, false);
    const auto narrow = arguments(H.data(), D, false);
    const auto row_major = arguments(Bt.data(), N, true);
    bd::Workspace ws;
    const auto token = [&] {
      bd::kernel::gemm(column_major, Blocking{}, 0, ws);
      bd::kernel::gemm(narrow, Blocking{}, 0, ws);
      bd::kernel::gemm(row_major, Blocking{}, 0, ws);
    };
    const long before_first = bd_test::allocations();
    token();
    const long first = bd_test::allocations() - before_first;
    const Mat<float> once = out;
    const long before = bd_test::allocations();
    for (int t = 0; t < 5; ++t) token();
    const long later = bd_test::allocations() - before;
    INFO("the first token allocated " << first << " times, five more " << later << " times");
    CHECK(first > 0);  // the counter sees the scratch being made
    CHECK(later == 0);
    CHECK(out == once);
    Mat<float> expected(1, N);
    expected << X(Eigen::all, low) * B.leftCols(W), X(Eigen::all, high) * B.rightCols(W);
    CHECK((out - expected).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() <= bound<float>(D) * 10);  // the last token: row-major B
  });
}

TEST_CASE("gemm kernel: a few rows against a row-major B (a weight read transposed) equal the product", BD_KERNEL_TEST_TAG) {
  bd_test::for_each_isa([&] {
    // Absorbed decoding reads each head's map transposed in place: a row-major B, which a few
    // rows read a run of each row at a time (skinny.hpp). Widths below, at and above the column
    // group (64) and not multiples of any vector; narrow B converted per run; every kind of start;
    // an empty depth; L = skinny_rows + 1 takes the packed path for comparison.
    const std::vector<Index> init{1, 4, 4, 6, 7, 8, 10, 13, 14, 16, 1};
    std::vector<Index> cols(init.size());
    for (std::size_t c = 0; c < cols.size(); ++c) cols[c] = Index(2 * c + 1) % 23;
    const std::vector<Index> empty_depth_init{2, 0, 1};
    for (Index L = 1; L <= bd::kernel::skinny_rows + 1; ++L) {
      for (Index N : {Index(11), Index(64), Index(150)})
        check<float, float>(L, channels_of(0, 37), N, Blocking{}, unsigned(L) + 80, nullptr, false, nullptr, true);
      check<float, float>(L, {5, 0, 9, 2, 11, 12, 3}, 11, Blocking{}, unsigned(L) + 81, &init, false, &cols, true);
      check<double, double>(L, channels_of(0, 97), 11, Blocking{}, unsigned(L) + 82, nullptr, true, nullptr, true);
      check<float, Eigen::half>(L, channels_of(1, 20, 2), 70, Blocking{}, unsigned(L) + 83, nullptr, true, nullptr, true);
      check<float, Eigen::bfloat16>(L, channels_of(1, 20, 2), 11, Blocking{}, unsigned(L) + 84, &init, false, nullptr, true);
      check<float, float>(L, {}, 3, Blocking{}, unsigned(L) + 85, &empty_depth_init, false, nullptr, true);
    }
  });
}

TEST_CASE("gemm kernel: a few rows against a row-major B, one thread and two agree bit for bit", BD_KERNEL_TEST_TAG "[threads]") {
  bd_test::for_each_isa([&] {
    const Index L = 2, K = 128, N = 520;  // 9 column groups to share
    const std::vector<Index> chan = channels_of(0, K);
    const Mat<float> X = bd_test::gaussian(L, K, 91).cast<float>();
    const Mat<float> Bt = bd_test::gaussian(N, K, 92).cast<float>();  // B = Btᵀ, row-major K × N
    Mat<float> one(L, N), two(L, N);
    for (int threads : {1, 2}) {
      bd::kernel::GemmArguments<float, float> a;
      a.rows = L, a.x = X.data(), a.ldx = L, a.b = Bt.data(), a.ldb = N, a.b_row_major = true;
      a.out = (threads == 1 ? one : two).data(), a.ldo = L;
      a.segments.push_back({chan.data(), K, 0, N});
      bd::kernel::gemm(a, Blocking{}, threads);
    }
    CHECK(one == two);
    CHECK((one - X * Bt.transpose()).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() <= bound<float>(K) * 10);
  });
}

TEST_CASE("gemm kernel: one row deeper than a quarter of L1 gives every column the bits it has alone", BD_KERNEL_TEST_TAG) {
  bd_test::for_each_isa([&] {
    // One token's row longer than 8 KiB is read against four columns at a time (decoding's
    // projections); each column's sum must still run as it does alone. Depths past the
    // threshold by a tail that is not a whole vector, widths that leave 1–3 columns over.
    const auto run = [](auto zero, Index K, Index N, unsigned seed) {
      using T = decltype(zero);
      const std::vector<Index> chan = channels_of(0, K);
      const Mat<T> x = bd_test::gaussian(1, K, seed).cast<T>();
      const Mat<T> B = bd_test::gaussian(K, N, seed + 1).cast<T>();
      Mat<T> all(1, N), alone(1, N);
      const auto product = [&](Index first, Index width, T* out) {
        bd::kernel::GemmArguments<T, T> a;
        a.rows = 1, a.x = x.data(), a.ldx = 1, a.b = B.data() + first * K, a.ldb = K, a.out = out, a.ldo = 1;
        a.segments.push_back({chan.data(), K, 0, width});
        bd::kernel::gemm(a, Blocking{}, 1);
      };
      product(0, N, all.data());
      for (Index c = 0; c < N; ++c) product(c, 1, alone.data() + c);
      CHECK(all == alone);
      CHECK((all - x * B).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() <= bound<T>(K) * 10);
    };
    for (Index N : {Index(4), Index(13), Index(70)}) {
      run(float(0), 4096 + 37, N, 95);
      run(float(0), 2048 + 37, N, 96);
      run(double(0), 1024 + 13, N, 97);
      run(float(0), 2048 - 8, N, 99);  // at the threshold: one column at a time
    }
  });
}

TEST_CASE("gemm kernel: a few rows over segments and two threads", BD_KERNEL_TEST_TAG "[threads]") {
  bd_test::for_each_isa([&] {
    // Wide enough (3 × 200 × 300 products) for the unpacked path to share columns among threads.
    const Index L = 3, K = 200, N = 300;
    const std::vector<Index> first = channels_of(0, K), second = channels_of(K + 2, K, 1);
    const Mat<float> X = bd_test::gaussian(L, 2 * K + 2, 71).cast<float>();
    const Mat<float> B = bd_test::gaussian(K, N, 72).cast<float>();
    Mat<float> one(L, N), two(L, N);
    for (int threads : {1, 2}) {
      bd::kernel::GemmArguments<float, float> a;
      a.rows = L, a.x = X.data(), a.ldx = L, a.b = B.data(), a.ldb = K;
      a.out = (threads == 1 ? one : two).data(), a.ldo = L;
      a.segments.push_back({first.data(), K, 0, 120});
      a.segments.push_back({second.data(), K, 120, N - 120});
      bd::kernel::gemm(a, Blocking{}, threads);
    }
    CHECK(one == two);
    CHECK((one.leftCols(120) - X(Eigen::all, first) * B.leftCols(120)).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() <= bound<float>(K) * 10);
    CHECK((one.rightCols(N - 120) - X(Eigen::all, second) * B.rightCols(N - 120)).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() <=
          bound<float>(K) * 10);
  });
}
