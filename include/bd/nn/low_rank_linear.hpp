// bd/nn/low_rank_linear.hpp — y = x·U·Vᵀ + b, the layer that low-rank pruning or a merged LoRA
// leaves behind (U: d_in × r, V: d_out × r). The dense oracle for BDLinear, and its speed twin:
// both products on the dispatched kernel, h = x·U into an L × r buffer, then y = h·Vᵀ + b with
// the bias as the accumulators' start. Vᵀ is what is stored (r × d_out, column-major), so that
// product reads it in its natural order whether it packs panels or, decoding a few tokens, takes
// one dot product per output column.
//
// Backward, from ∂y:  ∂Vᵀ = hᵀ·∂y,  ∂h = ∂y·V,  ∂U = xᵀ·∂h,  ∂x = ∂h·Uᵀ,  ∂b = Σ_rows ∂y.
#pragma once

#include <utility>
#include <vector>

#include <Eigen/Core>

#include "bd/base/error.hpp"
#include "bd/core/scalar.hpp"
#include "bd/core/validate.hpp"
#include "bd/kernel/matmul.hpp"
#include "bd/nn/dense_linear.hpp"
#include "bd/nn/gradients.hpp"
#include "bd/nn/types.hpp"

namespace bd::nn {

template <typename S = float>
class LowRankLinear {
public:
  using Scalar = S;
  using A = acc_t<S>;
  using Matrix = MatrixA<A>;
  using Stored = StoredMatrix<S>;
  using StoredVector = nn::StoredVector<S>;

  LowRankLinear() = default;
  LowRankLinear(const Stored& U, const Stored& V, StoredVector bias = {}) : U_(U), Vt_(V.transpose()), bias_(std::move(bias)) {
    bd::detail::require_nonempty(U_, "U");
    bd::detail::require_nonempty(Vt_, "V");
    if (U_.cols() != Vt_.rows())
      throw ShapeError(bd::detail::message("LowRankLinear: U is ", U_.rows(), "x", U_.cols(), " and V is ", Vt_.cols(), "x",
                                           Vt_.rows(), ", expected the same rank r"));
    if (bias_.size() && bias_.size() != Vt_.cols())
      throw ShapeError(bd::detail::message("LowRankLinear: bias has ", bias_.size(), " entries, expected d_out = ", Vt_.cols()));
    bd::detail::require_finite(U_, "U");
    bd::detail::require_finite(Vt_, "V");
    bd::detail::require_finite(bias_, "bias");
  }

  const Stored& U() const { return U_; }
  /// V (d_out × r), a view of the stored Vᵀ.
  Eigen::Transpose<const Stored> V() const { return Vt_.transpose(); }
  const StoredVector& bias() const { return bias_; }
  Index input_dim() const { return U_.rows(); }
  Index output_dim() const { return Vt_.cols(); }
  Index rank() const { return U_.cols(); }
  Index parameters() const { return U_.size() + Vt_.size(); }

  /// The arithmetic of forward (compute.hpp): f32, or bf16 (both products). RangeError where the
  /// stored type cannot honour bf16 (f64, f16). backward computes in f32.
  LowRankLinear& set_compute(Compute compute) {
    detail::require_compute<S>(compute, "LowRankLinear");
    compute_ = compute;
    return *this;
  }
  Compute compute() const { return compute_; }

  Matrix forward(const ConstRef<A>& x, Workspace& ws = default_workspace()) const {
    Matrix y(x.rows(), output_dim());
    forward_into(x, y, ws);
    return y;
  }

  /// y = (x·U)·Vᵀ + b into a caller's L × d_out matrix.
  void forward_into(const ConstRef<A>& x, Eigen::Ref<Matrix> y, Workspace& ws = default_workspace()) const {
    detail::require_linear_call("LowRankLinear", input_dim(), output_dim(), x.rows(), x.cols(), y.rows(), y.cols());
    const Matrix h = hidden(x, ws, compute_);
    Eigen::Matrix<A, Eigen::Dynamic, 1> buffer;
    bd::kernel::linear_into<A, S>(h.data(), h.outerStride(), h.rows(), rank(), Vt_.data(), Vt_.outerStride(), false,
                                  output_dim(), detail::bias_in(bias_, buffer), y.data(), y.outerStride(), 0, ws, compute_);
  }

  /// "U" (d_in × r), "Vt" (r × d_out), then "bias" when there is one.
  std::vector<Parameter<S>> trainable() {
    std::vector<Parameter<S>> out{detail::parameter("U", U_), detail::parameter("Vt", Vt_)};
    if (bias_.size()) out.push_back(detail::parameter("bias", bias_));
    return out;
  }

  /// How many tensors trainable() lists.
  std::size_t trainable_count() const { return 2 + (bias_.size() ? 1 : 0); }

  /// ∂x and the gradients of trainable(), given the forward's x and ∂y (h = x·U recomputed).
  Gradients<A> backward(const ConstRef<A>& x, const ConstRef<A>& dy, Workspace& ws = default_workspace()) const {
    detail::require_trainable<S, A>();
    detail::require_linear_call("LowRankLinear::backward", input_dim(), output_dim(), x.rows(), x.cols(), dy.rows(), dy.cols());
    const Matrix h = hidden(x, ws, Compute::F32);
    const Matrix dh = detail::product(dy, Vt_.transpose(), ws);
    Gradients<A> g;
    g.input = detail::product(dh, U_.transpose(), ws);
    g.parameters.push_back(detail::product(x.transpose(), dh, ws));
    g.parameters.push_back(detail::product(h.transpose(), dy, ws));
    if (bias_.size()) g.parameters.push_back(detail::column_sums<A>(dy));
    return g;
  }

private:
  Matrix hidden(const ConstRef<A>& x, Workspace& ws, Compute compute) const {
    Matrix h(x.rows(), rank());
    bd::kernel::linear_into<A, S>(x.data(), x.outerStride(), x.rows(), input_dim(), U_.data(), U_.outerStride(), false, rank(),
                                  nullptr, h.data(), h.outerStride(), 0, ws, compute);
    return h;
  }

  Stored U_, Vt_;
  StoredVector bias_;
  Compute compute_ = Compute::F32;
};

}  // namespace bd::nn
