// bd/nn/dense_linear.hpp — y = x·W + b (W: d_in × d_out, stored in S) on the dispatched kernel:
// the plain linear layer, beside LowRankLinear (x·U·Vᵀ + b) and BDLinear (its BD form). The
// three share one interface — forward, forward_into, input_dim, output_dim, parameters, and for
// training trainable() and backward() (gradients.hpp) — so a model (nn/llama.hpp) holds any.
//
// Backward, from ∂y:  ∂x = ∂y·Wᵀ,  ∂W = xᵀ·∂y,  ∂b = Σ_rows ∂y.
#pragma once

#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "bd/nn/compute.hpp"
#include "bd/base/error.hpp"
#include "bd/core/scalar.hpp"
#include "bd/core/validate.hpp"
#include "bd/kernel/matmul.hpp"
#include "bd/nn/gradients.hpp"
#include "bd/nn/types.hpp"

namespace bd::nn {

namespace detail {
/// Checks a linear layer's call: x has d_in columns, y is L × d_out.
inline void require_linear_call(const char* layer, Index d_in, Index d_out, Index x_rows, Index x_cols, Index y_rows,
                                Index y_cols) {
  if (x_cols != d_in)
    throw ShapeError(bd::detail::message(layer, " input has ", x_cols, " columns, expected ", d_in));
  if (y_rows != x_rows || y_cols != d_out)
    throw ShapeError(bd::detail::message(layer, " output is ", y_rows, "x", y_cols, ", expected ", x_rows, "x", d_out));
}

/// The bias in the arithmetic type: the stored values themselves when S is A, else converted
/// into `buffer` (a few values per call; nothing is cached, so training may change the bias).
template <typename A, typename S>
const A* bias_in(const StoredVector<S>& b, Eigen::Matrix<A, Eigen::Dynamic, 1>& buffer) {
  if (b.size() == 0) return nullptr;
  if constexpr (std::is_same_v<A, S>) {
    return b.data();
  } else {
    buffer = b.template cast<A>();
    return buffer.data();
  }
}

/// Σ over rows: a bias's gradient (a column vector, as the bias is stored).
template <typename A>
MatrixA<A> column_sums(const ConstRef<A>& dy) {
  return dy.colwise().sum().transpose();
}

/// out = a·b on the dispatched kernel (matmul.hpp), as a new matrix.
template <typename DA, typename DB>
auto product(const Eigen::MatrixBase<DA>& a, const Eigen::MatrixBase<DB>& b, Workspace& ws) {
  MatrixA<typename DA::Scalar> out(a.rows(), b.cols());
  bd::kernel::matmul_into(a, b, out, ws);
  return out;
}

template <typename S, typename A>
constexpr void require_trainable() {
  static_assert(std::is_same_v<S, A>, "training: weights stored in float or double (the arithmetic type)");
}
}  // namespace detail

template <typename S = float>
class DenseLinear {
public:
  using Scalar = S;
  using A = acc_t<S>;
  using Matrix = MatrixA<A>;
  using Stored = StoredMatrix<S>;
  using StoredVector = nn::StoredVector<S>;

  DenseLinear() = default;
  explicit DenseLinear(Stored W, StoredVector bias = {}) : W_(std::move(W)), bias_(std::move(bias)) {
    bd::detail::require_nonempty(W_, "W");
    if (bias_.size() && bias_.size() != W_.cols())
      throw ShapeError(bd::detail::message("DenseLinear: bias has ", bias_.size(), " entries, expected d_out = ", W_.cols()));
    bd::detail::require_finite(W_, "W");
    bd::detail::require_finite(bias_, "bias");
  }

  const Stored& weight() const { return W_; }
  const StoredVector& bias() const { return bias_; }

  /// The arithmetic of forward (compute.hpp): f32, or bf16. RangeError where the stored type
  /// cannot honour bf16 (f64, f16).
  DenseLinear& set_compute(Compute compute) {
    detail::require_compute<S>(compute, "DenseLinear");
    compute_ = compute;
    return *this;
  }
  Compute compute() const { return compute_; }
  Index input_dim() const { return W_.rows(); }
  Index output_dim() const { return W_.cols(); }
  Index parameters() const { return W_.size(); }

  Matrix forward(const ConstRef<A>& x, Workspace& ws = default_workspace()) const {
    Matrix y(x.rows(), output_dim());
    forward_into(x, y, ws);
    return y;
  }

  /// y = x·W + b into a caller's L × d_out matrix; the bias is the accumulators' start.
  void forward_into(const ConstRef<A>& x, Eigen::Ref<Matrix> y, Workspace& ws = default_workspace()) const {
    detail::require_linear_call("DenseLinear", input_dim(), output_dim(), x.rows(), x.cols(), y.rows(), y.cols());
    Eigen::Matrix<A, Eigen::Dynamic, 1> buffer;
    bd::kernel::linear_into<A, S>(x.data(), x.outerStride(), x.rows(), x.cols(), W_.data(), W_.outerStride(), false,
                                  output_dim(), detail::bias_in(bias_, buffer), y.data(), y.outerStride(), 0, ws, compute_);
  }

  /// "weight" (d_in × d_out), then "bias" when there is one.
  std::vector<Parameter<S>> trainable() {
    std::vector<Parameter<S>> out{detail::parameter("weight", W_)};
    if (bias_.size()) out.push_back(detail::parameter("bias", bias_));
    return out;
  }

  /// How many tensors trainable() lists.
  std::size_t trainable_count() const { return 1 + (bias_.size() ? 1 : 0); }

  /// ∂x and the gradients of trainable(), given the forward's x and ∂y.
  Gradients<A> backward(const ConstRef<A>& x, const ConstRef<A>& dy, Workspace& ws = default_workspace()) const {
    detail::require_trainable<S, A>();
    detail::require_linear_call("DenseLinear::backward", input_dim(), output_dim(), x.rows(), x.cols(), dy.rows(), dy.cols());
    Gradients<A> g;
    g.input = detail::product(dy, W_.transpose(), ws);
    g.parameters.push_back(detail::product(x.transpose(), dy, ws));
    if (bias_.size()) g.parameters.push_back(detail::column_sums<A>(dy));
    return g;
  }

private:
  Stored W_;
  StoredVector bias_;
  Compute compute_ = Compute::F32;
};

}  // namespace bd::nn
