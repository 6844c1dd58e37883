// bd/nn/gradients.hpp — what training needs from a layer: its trainable tensors, named, as views
// into the layer (trainable()), and what its backward pass returns: the gradient with respect to
// its input(s) and to each of those tensors, in the same order and shape.
#pragma once

#include <string>
#include <vector>

#include <Eigen/Core>

namespace bd::nn {

/// A trainable tensor of a layer, viewed in place (a bias is an n × 1 matrix). Writing through
/// the view changes the layer; the layer must outlive the view.
template <typename S>
struct Parameter {
  std::string name;
  Eigen::Map<Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>> value;
};

/// ∂loss/∂(input) and ∂loss/∂(each trainable tensor), given ∂loss/∂(output).
template <typename A>
struct Gradients {
  Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic> input;      ///< ∂/∂x
  Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic> kv_input;   ///< ∂/∂x_kv (cross-attention), else empty
  std::vector<Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic>> parameters;
};

namespace detail {
/// A view of a stored matrix or vector as a trainable tensor.
template <typename Derived>
Parameter<typename Derived::Scalar> parameter(std::string name, Eigen::PlainObjectBase<Derived>& m) {
  return {std::move(name), {m.data(), m.rows(), m.cols()}};
}
}  // namespace detail

}  // namespace bd::nn
