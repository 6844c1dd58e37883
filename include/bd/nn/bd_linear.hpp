// bd/nn/bd_linear.hpp — a low-rank linear layer in BD form (paper §3.3):
//     W = U·Vᵀ = B·[I, C]·Pᵀ (column form),   h = x·B,   y[:, S] = h,   y[:, R] = h·C (+ b)
// r(d_in + d_out − r) parameters and multiply-adds per token instead of r(d_in + d_out): a
// saving of r/(d_in + d_out), exactly.
//
// forward runs both products on bd::kernel::gemm (runtime-dispatched micro-kernels): h = x·B
// written into y's basis columns S, then h·C read from there and written straight into y's
// rest columns R with the bias as the accumulators' start. No buffer besides y, no copy pass;
// narrow storage is converted panel by panel.
//
// Backward (training through B and C, the paper's §5.2), from ∂y:
//   ∂h = ∂y[:, S] + ∂y[:, R]·Cᵀ,  ∂C = hᵀ·∂y[:, R],  ∂B = xᵀ·∂h,  ∂x = ∂h·Bᵀ,  ∂b = Σ_rows ∂y.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "bd/core/basis_selection.hpp"
#include "bd/core/decompose.hpp"
#include "bd/core/truncated_svd.hpp"
#include "bd/kernel/gemm.hpp"
#include "bd/nn/dense_linear.hpp"
#include "bd/nn/gradients.hpp"
#include "bd/nn/low_rank_linear.hpp"

namespace bd::nn {

template <typename S = float>
class BDLinear {
public:
  using Scalar = S;
  using A = acc_t<S>;
  using Matrix = MatrixA<A>;
  using Stored = StoredMatrix<S>;
  using StoredVector = nn::StoredVector<S>;

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

  /// From a dense W (d_in × d_out): truncated SVD to `rank` (core/truncated_svd.hpp), then BD.
  /// truncation_nmse() is the SVD's error, report().nmse the BD error against the truncation.
  template <typename Derived>
  static BDLinear from_dense(const Eigen::MatrixBase<Derived>& W, Index rank, bd::Options opts = {},
                             const Eigen::VectorXd& bias = {}) {
    bd::detail::require_nonempty(W, "W");
    bd::detail::require_finite(W, "W");
    bd::detail::require_rank(rank, W.rows(), W.cols(), "W");
    const bd::TruncatedSVD<double> svd = bd::truncated_svd<double>(W.template cast<double>(), rank);
    opts.side = bd::Side::Col;
    BDLinear out;
    out.decomposition_ = bd::decompose_product<S>(svd.U, svd.V, opts);
    out.truncation_nmse_ = svd.energy > 0 ? svd.dropped_energy / svd.energy : 0.0;
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

  /// The arithmetic of forward (compute.hpp): f32, or bf16 (x·B and h·C with their operands
  /// rounded once; h itself kept in f32 in y[:, S]). RangeError where the stored type cannot
  /// honour bf16 (f64, f16). backward computes in f32.
  BDLinear& set_compute(Compute compute) {
    detail::require_compute<S>(compute, "BDLinear");
    compute_ = compute;
    return *this;
  }
  Compute compute() const { return compute_; }

  /// y = x·W + b (L × d_out).
  Matrix forward(const ConstRef<A>& x, Workspace& ws = default_workspace()) const {
    Matrix y(x.rows(), output_dim());
    forward_into(x, y, ws);
    return y;
  }

  /// The same into a caller's y (L × d_out), which needs no other buffer: the first product
  /// writes h = x·B straight into y's basis columns S, the second reads them back as its input
  /// and writes y[:, R] = h·C + b_R, and b_S is added to y[:, S] last.
  void forward_into(const ConstRef<A>& x, Eigen::Ref<Matrix> y, Workspace& ws = default_workspace()) const {
    if (x.cols() != input_dim())
      throw ShapeError(bd::detail::message("BDLinear input has ", x.cols(), " columns, expected ", input_dim()));
    if (y.rows() != x.rows() || y.cols() != output_dim())
      throw ShapeError(bd::detail::message("BDLinear output is ", y.rows(), "x", y.cols(), ", expected ", x.rows(), "x",
                                           output_dim()));
    const auto& B = decomposition_.basis();  // d_in × r
    const auto& C = decomposition_.coeff();  // r × (d_out − r)
    const Index L = x.rows(), r = rank();
    const auto& S_idx = decomposition_.indices();
    bd::kernel::GemmArguments<A, S> first;  // y[:, S] = h = x·B
    first.rows = L;
    first.x = x.data(), first.ldx = x.outerStride();
    first.b = B.data(), first.ldb = B.outerStride();
    first.out = y.data(), first.ldo = y.outerStride();
    first.out_columns = S_idx.data();
    first.segments.push_back({inputs_.data(), input_dim(), 0, r});
    first.compute = compute_;
    bd::kernel::gemm(first, {}, 0, ws);
    bd::kernel::GemmArguments<A, S> second;  // y[:, R] = h·C + b_R, h read from y[:, S]
    second.rows = L;
    second.x = y.data(), second.ldx = y.outerStride();
    second.b = C.data(), second.ldb = C.outerStride();
    second.out = y.data(), second.ldo = y.outerStride();
    second.out_columns = rest_.data();
    Eigen::Matrix<A, Eigen::Dynamic, 1> bias_rest;
    if (bias_.size()) bias_rest = bias_(rest_).template cast<A>();
    second.init_values = bias_.size() ? bias_rest.data() : nullptr;
    second.segments.push_back({S_idx.data(), r, 0, output_dim() - r});
    second.compute = compute_;
    bd::kernel::gemm(second, {}, 0, ws);
    if (bias_.size())
      for (Index k = 0; k < r; ++k) {
        const Index s = S_idx[static_cast<std::size_t>(k)];
        y.col(s).array() += static_cast<A>(bias_[s]);
      }
  }

  /// "basis" (B, d_in × r), "coeff" (C, r × (d_out − r)), then "bias" when there is one.
  std::vector<Parameter<S>> trainable() {
    std::vector<Parameter<S>> out{detail::parameter("basis", decomposition_.basis_for_update()),
                                  detail::parameter("coeff", decomposition_.coeff_for_update())};
    if (bias_.size()) out.push_back(detail::parameter("bias", bias_));
    return out;
  }

  /// How many tensors trainable() lists.
  std::size_t trainable_count() const { return 2 + (bias_.size() ? 1 : 0); }

  /// ∂x and the gradients of trainable(), given the forward's x and ∂y (h = x·B recomputed).
  Gradients<A> backward(const ConstRef<A>& x, const ConstRef<A>& dy, Workspace& ws = default_workspace()) const {
    detail::require_trainable<S, A>();
    detail::require_linear_call("BDLinear::backward", input_dim(), output_dim(), x.rows(), x.cols(), dy.rows(), dy.cols());
    const auto& B = decomposition_.basis();
    const auto& C = decomposition_.coeff();
    const Matrix h = detail::product(x, B, ws);
    const Matrix dy_rest = dy(Eigen::all, rest_);
    Matrix dh = dy(Eigen::all, decomposition_.indices());
    bd::kernel::matmul_add_into(dy_rest, C.transpose(), dh, ws);
    Gradients<A> g;
    g.input = detail::product(dh, B.transpose(), ws);
    g.parameters.push_back(detail::product(x.transpose(), dh, ws));
    g.parameters.push_back(detail::product(h.transpose(), dy_rest, ws));
    if (bias_.size()) g.parameters.push_back(detail::column_sums<A>(dy));
    return g;
  }

private:
  void finish(const Eigen::VectorXd& bias) {
    rest_ = decomposition_.rest();
    inputs_ = bd::detail::contiguous(0, decomposition_.rows());
    if (bias.size()) {
      if (bias.size() != decomposition_.cols())
        throw ShapeError(bd::detail::message("BDLinear: bias has ", bias.size(), " entries, expected d_out = ",
                                             decomposition_.cols()));
      bias_ = round_matrix<S>(bias);
    }
  }

  bd::Decomposition<S> decomposition_;
  std::vector<Index> rest_, inputs_;  // R; 0..d_in−1
  StoredVector bias_;
  double truncation_nmse_ = 0;
  Compute compute_ = Compute::F32;
};

}  // namespace bd::nn
