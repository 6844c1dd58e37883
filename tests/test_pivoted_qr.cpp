// bd::kernel::ColumnPivots — the pivot order of QR with column pivoting, which picks each head's
// pivoted basis — is Businger–Golub's greedy choice on every micro-kernel this CPU runs: each
// pivot is a remaining column of largest norm orthogonal to the ones chosen before (to the
// rounding of the arithmetic type), |R_jj| is that norm, and a rank-k matrix has k nonzero
// |R_jj| and then nothing above the rounding.
#include <bd/kernel/pivoted_qr.hpp>

#include <algorithm>
#include <set>

#include "support.hpp"

namespace {

// Householder QR is backward stable: the computed norms err by a small multiple of
// rows·u·‖A‖ (Higham, Thm 19.4); 16·rows·u·max‖A_c‖ bounds it with room.
template <typename T>
double tolerance(const Eigen::MatrixXd& A) {
  return 16.0 * double(A.rows()) * double(Eigen::NumTraits<T>::epsilon()) * A.colwise().norm().maxCoeff();
}

/// Replays the choice in double: at step j the chosen column's residual (orthogonal to the
/// columns chosen before) is the largest remaining one and equals |R_jj|, both within `tol`.
template <typename T>
void check_greedy(const Eigen::MatrixXd& A, Eigen::Index count, unsigned seed_note) {
  INFO("A is " << A.rows() << "x" << A.cols() << ", count " << count << ", seed " << seed_note);
  bd::kernel::ColumnPivots<T> pivots;
  pivots.compute(A.cast<T>(), count);
  const auto& order = pivots.order();
  REQUIRE(static_cast<Eigen::Index>(order.size()) == count);
  REQUIRE(pivots.r_diagonal().size() == count);
  REQUIRE(std::set<Eigen::Index>(order.begin(), order.end()).size() == order.size());
  const double tol = tolerance<T>(A);
  Eigen::MatrixXd residual = A.cast<T>().template cast<double>();  // the input as the kernel saw it
  std::vector<bool> chosen(static_cast<std::size_t>(A.cols()), false);
  for (Eigen::Index j = 0; j < count; ++j) {
    const Eigen::Index c = order[static_cast<std::size_t>(j)];
    REQUIRE(c >= 0);
    REQUIRE(c < A.cols());
    double largest = 0;
    for (Eigen::Index k = 0; k < A.cols(); ++k)
      if (!chosen[static_cast<std::size_t>(k)]) largest = std::max(largest, residual.col(k).norm());
    const double mine = residual.col(c).norm();
    INFO("pivot " << j << " = column " << c);
    CHECK(mine >= largest - tol);
    CHECK(std::abs(double(pivots.r_diagonal()(j)) - mine) <= tol);
    chosen[static_cast<std::size_t>(c)] = true;
    if (mine > 0) {
      const Eigen::VectorXd q = residual.col(c) / mine;
      residual -= q * (q.transpose() * residual);
    }
  }
}

template <typename T>
void check_shapes() {
  for (auto [rows, cols, count] : {std::tuple<int, int, int>{128, 512, 128}, {37, 90, 37}, {16, 16, 16}, {5, 200, 5},
                                   {129, 300, 100}, {64, 48, 48}, {1, 7, 1}}) {
    const unsigned seed = 41u + unsigned(rows * 7 + cols);
    check_greedy<T>(bd_test::gaussian(rows, cols, seed), count, seed);
  }
  // Columns of unequal norms, as F's rows are (W's row norms differ).
  Eigen::MatrixXd scaled = bd_test::gaussian(48, 160, 7u);
  for (Eigen::Index c = 0; c < scaled.cols(); ++c) scaled.col(c) *= std::pow(1.05, double(c % 37));
  check_greedy<T>(scaled, 48, 7u);
}

}  // namespace

TEST_CASE("column pivots: each pivot is the remaining column of largest residual norm, float and double",
          "[kernel][pivoted_qr]") {
  bd_test::for_each_isa([] {
    check_shapes<double>();
    check_shapes<float>();
  });
}

TEST_CASE("column pivots: a rank-k matrix has k nonzero |R_jj|, then only rounding", "[kernel][pivoted_qr]") {
  bd_test::for_each_isa([] {
    const Eigen::MatrixXd A = bd_test::gaussian(96, 12, 3u) * bd_test::gaussian(12, 200, 4u);  // rank 12
    bd::kernel::ColumnPivots<double> pivots;
    pivots.compute(A, 40);
    const double tol = tolerance<double>(A);
    const Eigen::VectorXd d = pivots.r_diagonal();
    CHECK(d.head(12).minCoeff() > 1e3 * tol);
    CHECK(d.tail(28).maxCoeff() <= tol);
    // The same object reused for another shape, then the first again: storage is re-laid out
    // and its zero padding kept.
    pivots.compute(bd_test::gaussian(20, 30, 5u), 20);
    pivots.compute(A, 40);
    CHECK(pivots.r_diagonal() == d);
  });
}
