// bd/nn/low_rank_linear.hpp — y = x·U·Vᵀ + b, the layer that low-rank pruning or a merged LoRA
// leaves behind (U: d_in × r, V: d_out × r). The dense oracle for BDLinear.
#pragma once

#include <utility>

#include <Eigen/Core>

#include "bd/core/error.hpp"
#include "bd/core/scalar.hpp"
#include "bd/core/validate.hpp"
#include "bd/nn/attention_core.hpp"

namespace bd::nn {

template <typename S = float>
class LowRankLinear {
public:
  using Scalar = S;
  using A = acc_t<S>;
  using Matrix = MatrixA<A>;
  using Stored = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>;
  using StoredVector = Eigen::Matrix<S, Eigen::Dynamic, 1>;

  LowRankLinear() = default;
  LowRankLinear(Stored U, Stored V, StoredVector bias = {}) : U_(std::move(U)), V_(std::move(V)), bias_(std::move(bias)) {
    bd::detail::require_nonempty(U_, "U");
    bd::detail::require_nonempty(V_, "V");
    if (U_.cols() != V_.cols())
      throw ShapeError(bd::detail::message("LowRankLinear: U is ", U_.rows(), "x", U_.cols(), " and V is ", V_.rows(), "x",
                                           V_.cols(), ", expected the same rank r"));
    if (bias_.size() && bias_.size() != V_.rows())
      throw ShapeError(bd::detail::message("LowRankLinear: bias has ", bias_.size(), " entries, expected d_out = ", V_.rows()));
    bd::detail::require_finite(U_, "U");
    bd::detail::require_finite(V_, "V");
    bd::detail::require_finite(bias_, "bias");
  }

  const Stored& U() const { return U_; }
  const Stored& V() const { return V_; }
  const StoredVector& bias() const { return bias_; }
  Index input_dim() const { return U_.rows(); }
  Index output_dim() const { return V_.rows(); }
  Index rank() const { return U_.cols(); }
  Index parameters() const { return U_.size() + V_.size(); }

  Matrix forward(const Matrix& x) const {
    if (x.cols() != input_dim())
      throw ShapeError(bd::detail::message("LowRankLinear input has ", x.cols(), " columns, expected ", input_dim()));
    Matrix y = (x * U_.template cast<A>()) * V_.template cast<A>().transpose();
    if (bias_.size()) y.rowwise() += bias_.template cast<A>().transpose();
    return y;
  }

private:
  Stored U_, V_;
  StoredVector bias_;
};

}  // namespace bd::nn
