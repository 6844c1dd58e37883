// bd/train/optimizer.hpp — Adam (Kingma & Ba 2015) over a ParameterSet's flat view, the Noam
// learning-rate schedule of "Attention Is All You Need" (fairseq's inverse_sqrt with warm-up is
// the same shape), and clipping of the gradient's global norm.
//
//   Noam:  lr(t) = scale · d^(−1/2) · min(t^(−1/2), t · warmup^(−3/2))        (t ≥ 1)
//   Adam:  m ← β₁m + (1 − β₁)g,  v ← β₂v + (1 − β₂)g²,
//          θ ← θ − lr · m̂ / (√v̂ + ε),  m̂ = m/(1 − β₁ᵗ), v̂ = v/(1 − β₂ᵗ)
#pragma once

#include <cmath>
#include <vector>

#include <Eigen/Core>

#include "bd/base/error.hpp"
#include "bd/train/parameters.hpp"

namespace bd::train {

/// The Noam schedule: linear warm-up, then decay as t^(−1/2), scaled by d^(−1/2).
struct NoamSchedule {
  double scale = 1;       ///< the learning-rate scale the paper sweeps (0.5, 1, 2, 4)
  double model_dim = 512;
  double warmup = 4000;

  double operator()(long step) const {
    const double t = double(std::max(1L, step));
    return scale / std::sqrt(model_dim) * std::min(1 / std::sqrt(t), t / (warmup * std::sqrt(warmup)));
  }
};

/// Scales the gradient so its global L2 norm is at most max_norm; returns the norm before.
template <typename S>
double clip_gradient(ParameterSet<S>& p, double max_norm) {
  const double norm = std::sqrt(p.gradient().template cast<double>().squaredNorm());
  if (max_norm > 0 && norm > max_norm) p.gradient() *= S(max_norm / norm);
  return norm;
}

template <typename S>
class Adam {
public:
  struct Options {
    double beta1 = 0.9, beta2 = 0.98, eps = 1e-9;  ///< the Transformer's settings
  };

  explicit Adam(Index parameters, Options o = {}) : o_(o), m_(Vector::Zero(parameters)), v_(Vector::Zero(parameters)) {}

  /// One step with learning rate lr on the set's flat gradient.
  void step(ParameterSet<S>& p, double lr) {
    if (p.size() != m_.size())
      throw ShapeError(bd::detail::message("Adam: ", m_.size(), " moments for ", p.size(), " parameters"));
    ++t_;
    const double c1 = 1 - std::pow(o_.beta1, double(t_)), c2 = 1 - std::pow(o_.beta2, double(t_));
    const S b1 = S(o_.beta1), b2 = S(o_.beta2), step = S(lr / c1), eps = S(o_.eps), root_c2 = S(std::sqrt(c2));
    auto g = p.gradient();
    Vector theta = p.values();
    for (Index i = 0; i < theta.size(); ++i) {
      m_[i] = b1 * m_[i] + (1 - b1) * g[i];
      v_[i] = b2 * v_[i] + (1 - b2) * g[i] * g[i];
      theta[i] -= step * m_[i] / (std::sqrt(v_[i]) / root_c2 + eps);
    }
    p.set_values(theta);
  }

  long steps() const { return t_; }

private:
  using Vector = Eigen::Matrix<S, Eigen::Dynamic, 1>;
  Options o_;
  Vector m_, v_;
  long t_ = 0;
};

}  // namespace bd::train
