// bd/nn/bd_linear.hpp — a low-rank linear layer in BD form (paper §3.3):
//     W = U·Vᵀ = B·[I, C]·Pᵀ (column form),   h = x·B,   y[:, S] = h,   y[:, R] = h·C (+ b)
// r(d_in + d_out − r) parameters and multiply-adds per token instead of r(d_in + d_out): a
// saving of r/(d_in + d_out), exactly.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <Eigen/SVD>

#include "bd/core/basis_selection.hpp"
#include "bd/core/decompose.hpp"
#include "bd/nn/low_rank_linear.hpp"

namespace bd::nn {

template <typename S = float>
class BDLinear {
public:
  using Scalar = S;
  using A = acc_t<S>;
  using Matrix = MatrixA<A>;
  using Stored = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>;
  using StoredVector = Eigen::Matrix<S, Eigen::Dynamic, 1>;

  BDLinear() = default;

  /// From a low-rank layer: BD of U·Vᵀ from its factors.
  template <typename T>
  static BDLinear from_low_rank(const LowRankLinear<T>& layer, bd::Options opts = {}) {
    opts.side = bd::Side::Col;  // C on the output side: y[:, R] = h·C
    BDLinear out;
    out.decomposition_ = bd::decompose_product<S>(layer.U(), layer.V(), opts);
    out.finish(layer.bias().template cast<double>());
    return out;
  }

  /// From a dense W (d_in × d_out): truncated SVD to `rank` (Eigen's BDCSVD), then BD.
  /// truncation_nmse() is the SVD's error, report().nmse the BD error against the truncation.
  template <typename Derived>
  static BDLinear from_dense(const Eigen::MatrixBase<Derived>& W, Index rank, bd::Options opts = {},
                             const Eigen::VectorXd& bias = {}) {
    bd::detail::require_nonempty(W, "W");
    bd::detail::require_finite(W, "W");
    bd::detail::require_rank(rank, W.rows(), W.cols(), "W");
    const Eigen::MatrixXd Wd = W.template cast<double>();
    Eigen::BDCSVD<Eigen::MatrixXd> svd(Wd, Eigen::ComputeThinU | Eigen::ComputeThinV);
    const Eigen::VectorXd sigma = svd.singularValues();
    const Eigen::MatrixXd U = svd.matrixU().leftCols(rank) * sigma.head(rank).asDiagonal();
    const Eigen::MatrixXd V = svd.matrixV().leftCols(rank);
    opts.side = bd::Side::Col;
    BDLinear out;
    out.decomposition_ = bd::decompose_product<S>(U, V, opts);
    const double energy = Wd.squaredNorm();
    out.truncation_nmse_ = energy > 0 ? sigma.tail(sigma.size() - rank).squaredNorm() / energy : 0.0;
    out.finish(bias);
    return out;
  }

  const bd::Decomposition<S>& decomposition() const { return decomposition_; }
  const bd::Report& report() const { return decomposition_.report(); }
  double truncation_nmse() const { return truncation_nmse_; }
  Index input_dim() const { return decomposition_.rows(); }
  Index output_dim() const { return decomposition_.cols(); }
  Index rank() const { return decomposition_.rank(); }
  Index parameters() const { return decomposition_.parameters(); }
  const StoredVector& bias() const { return bias_; }

  Matrix forward(const Matrix& x) const {
    if (x.cols() != input_dim())
      throw ShapeError(bd::detail::message("BDLinear input has ", x.cols(), " columns, expected ", input_dim()));
    const Matrix h = x * decomposition_.basis().template cast<A>();  // L × r
    const Matrix rebuilt = h * decomposition_.coeff().template cast<A>();
    Matrix y(x.rows(), output_dim());
    y(Eigen::all, decomposition_.indices()) = h;
    y(Eigen::all, rest_) = rebuilt;
    if (bias_.size()) y.rowwise() += bias_.template cast<A>().transpose();
    return y;
  }

private:
  void finish(const Eigen::VectorXd& bias) {
    rest_ = decomposition_.rest();
    if (bias.size()) {
      if (bias.size() != decomposition_.cols())
        throw ShapeError(bd::detail::message("BDLinear: bias has ", bias.size(), " entries, expected d_out = ",
                                             decomposition_.cols()));
      bias_ = round_matrix<S>(bias);
    }
  }

  bd::Decomposition<S> decomposition_;
  std::vector<Index> rest_;
  StoredVector bias_;
  double truncation_nmse_ = 0;
};

}  // namespace bd::nn
