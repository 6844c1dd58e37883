// bd/train/parameters.hpp — every trainable tensor of a model and its gradient as one flat view:
// what the optimizer, gradient clipping and checkpoints see. The tensors stay where their layers
// keep them (nn::Parameter maps them in place); the set gathers and scatters their values, and
// holds the flat gradient that the layers' backward passes (nn::Gradients) accumulate into.
// The layers must not be moved or resized while their tensors are in a set.
#pragma once

#include <string>
#include <vector>

#include <Eigen/Core>

#include "bd/base/error.hpp"
#include "bd/base/index.hpp"
#include "bd/nn/gradients.hpp"

namespace bd::train {

using bd::Index;

template <typename S>
class ParameterSet {
public:
  using Vector = Eigen::Matrix<S, Eigen::Dynamic, 1>;
  using Matrix = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>;

  /// Appends tensors (a layer's trainable(), names prefixed); returns the index of the first.
  std::size_t add(const std::string& prefix, const std::vector<nn::Parameter<S>>& tensors) {
    const std::size_t first = params_.size();
    for (const nn::Parameter<S>& p : tensors) {
      params_.push_back({prefix + p.name, p.value});
      offsets_.push_back(size_);
      size_ += p.value.size();
    }
    gradient_ = Vector::Zero(size_);
    return first;
  }

  Index size() const { return size_; }
  std::size_t count() const { return params_.size(); }
  const nn::Parameter<S>& operator[](std::size_t i) const { return params_[i]; }
  nn::Parameter<S>& operator[](std::size_t i) { return params_[i]; }

  /// Every tensor's values, one after the other (column-major each).
  Vector values() const {
    Vector out(size_);
    for (std::size_t i = 0; i < params_.size(); ++i)
      out.segment(offsets_[i], params_[i].value.size()) = params_[i].value.reshaped();
    return out;
  }
  void set_values(const Vector& v) {
    if (v.size() != size_) throw ShapeError(bd::detail::message("ParameterSet: ", v.size(), " values for ", size_));
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto& m = params_[i].value;
      m.reshaped() = v.segment(offsets_[i], m.size());
    }
  }

  /// The flat gradient, in values()'s order.
  Eigen::Ref<Vector> gradient() { return gradient_; }
  void zero_gradient() { gradient_.setZero(); }

  /// Adds a backward pass's parameter gradients (in the order and shapes of the tensors added
  /// from index `first` on).
  void accumulate(std::size_t first, const std::vector<Matrix>& grads) {
    for (std::size_t k = 0; k < grads.size(); ++k) {
      const std::size_t i = first + k;
      if (i >= params_.size() || grads[k].rows() != params_[i].value.rows() || grads[k].cols() != params_[i].value.cols())
        throw ShapeError(bd::detail::message("ParameterSet::accumulate: gradient ", k, " (", grads[k].rows(), "x",
                                             grads[k].cols(), ") does not fit tensor ", i));
      gradient_.segment(offsets_[i], grads[k].size()) += grads[k].reshaped();
    }
  }

private:
  std::vector<nn::Parameter<S>> params_;
  std::vector<Index> offsets_;
  Index size_ = 0;
  Vector gradient_;
};

}  // namespace bd::train
