// bd/train/layers.hpp — the pieces of a Transformer language model that have no BD form, each
// with its backward pass: token embedding with sinusoidal positions, RMSNorm, the position-wise
// feed-forward block, and softmax cross-entropy. (Attention and the linear layers are nn's, with
// theirs.) Rows are tokens; a batch of sequences is their rows stacked.
//
//   embedding   x_t = √d·E[token_t] + PE(position_t),  PE(p, 2i) = sin(p/10000^(2i/d)), PE(p, 2i+1) = cos(…)
//   RMSNorm     y = x ⊙ g / r,  r = √(mean(x²) + ε);   ∂x = (g ⊙ ∂y)/r − x·⟨g ⊙ ∂y, x⟩/(d·r³)
//   FFN         y = W₂·relu(W₁·x + b₁) + b₂
//   loss        mean over tokens of −log softmax(logits)[target];  ∂logits = (softmax − onehot)/N
#pragma once

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "bd/base/error.hpp"
#include "bd/base/index.hpp"
#include "bd/nn/dense_linear.hpp"
#include "bd/nn/gradients.hpp"

namespace bd::train {

using bd::Index;
template <typename T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
template <typename T>
using Vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;

/// Uniform in [−limit, limit] from a seeded generator: the same values on every machine.
template <typename T>
Matrix<T> uniform(Index rows, Index cols, double limit, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-limit, limit);
  Matrix<T> m(rows, cols);
  for (Index j = 0; j < cols; ++j)
    for (Index i = 0; i < rows; ++i) m(i, j) = T(u(rng));
  return m;
}

/// A d_in × d_out weight with Glorot's uniform limit √(6/(d_in + d_out)).
template <typename T>
Matrix<T> glorot(Index d_in, Index d_out, std::mt19937_64& rng) {
  return uniform<T>(d_in, d_out, std::sqrt(6.0 / double(d_in + d_out)), rng);
}

/// Token embedding (vocab × d), scaled by √d, plus fixed sinusoidal positions.
template <typename T>
class Embedding {
public:
  Embedding() = default;
  Embedding(Index vocab, Index d, std::mt19937_64& rng) : table_(uniform<T>(vocab, d, std::sqrt(3.0 / double(d)), rng)) {}

  Index vocab() const { return table_.rows(); }
  Index dim() const { return table_.cols(); }

  /// Rows for `count` sequences of `length` tokens, stacked (token i of sequence s is row s·length + i).
  Matrix<T> forward(const std::vector<int>& tokens, Index length) const {
    if (length <= 0 || Index(tokens.size()) % length)
      throw ShapeError(bd::detail::message("Embedding: ", tokens.size(), " tokens are not whole sequences of ", length));
    const Index d = dim();
    Matrix<T> x(Index(tokens.size()), d);
    const T scale = T(std::sqrt(double(d)));
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] < 0 || tokens[i] >= vocab())
        throw RangeError(bd::detail::message("Embedding: token ", tokens[i], " outside the vocabulary of ", vocab()));
      const Index p = Index(i) % length;
      for (Index k = 0; k < d; ++k) {
        const double angle = double(p) / std::pow(10000.0, double(k - k % 2) / double(d));
        x(Index(i), k) = table_(tokens[i], k) * scale + T(k % 2 ? std::cos(angle) : std::sin(angle));
      }
    }
    return x;
  }

  std::vector<nn::Parameter<T>> trainable() { return {nn::detail::parameter("table", table_)}; }

  /// ∂table: each row's gradient, scaled by √d, added to its token's row.
  std::vector<Matrix<T>> backward(const std::vector<int>& tokens, const Matrix<T>& dx) const {
    Matrix<T> d_table = Matrix<T>::Zero(table_.rows(), table_.cols());
    const T scale = T(std::sqrt(double(dim())));
    for (std::size_t i = 0; i < tokens.size(); ++i) d_table.row(tokens[i]) += dx.row(Index(i)) * scale;
    return {d_table};
  }

private:
  Matrix<T> table_;
};

/// RMSNorm with a learned gain (initialised to ones).
template <typename T>
class RMSNorm {
public:
  RMSNorm() = default;
  explicit RMSNorm(Index d, double eps = 1e-5) : gain_(Vector<T>::Ones(d)), eps_(eps) {}

  Matrix<T> forward(const Matrix<T>& x) const {
    Matrix<T> y(x.rows(), x.cols());
    for (Index i = 0; i < x.rows(); ++i) y.row(i) = x.row(i).cwiseProduct(gain_.transpose()) / rms(x, i);
    return y;
  }

  std::vector<nn::Parameter<T>> trainable() { return {nn::detail::parameter("gain", gain_)}; }

  /// ∂x and {∂gain}.
  nn::Gradients<T> backward(const Matrix<T>& x, const Matrix<T>& dy) const {
    nn::Gradients<T> g;
    g.input.resize(x.rows(), x.cols());
    Vector<T> d_gain = Vector<T>::Zero(gain_.size());
    const T d = T(x.cols());
    for (Index i = 0; i < x.rows(); ++i) {
      const T r = rms(x, i);
      const auto gdy = dy.row(i).cwiseProduct(gain_.transpose());
      d_gain += (dy.row(i).cwiseProduct(x.row(i)) / r).transpose();
      g.input.row(i) = gdy / r - x.row(i) * (gdy.dot(x.row(i)) / (d * r * r * r));
    }
    g.parameters.push_back(d_gain);
    return g;
  }

private:
  T rms(const Matrix<T>& x, Index i) const {
    return T(std::sqrt(double(x.row(i).squaredNorm()) / double(x.cols()) + eps_));
  }
  Vector<T> gain_;
  double eps_ = 1e-5;
};

/// The position-wise feed-forward block: W₂·relu(W₁·x + b₁) + b₂, on nn::DenseLinear.
template <typename T>
class FeedForward {
public:
  FeedForward() = default;
  FeedForward(Index d, Index hidden, std::mt19937_64& rng)
      : up_(glorot<T>(d, hidden, rng), Vector<T>::Zero(hidden)), down_(glorot<T>(hidden, d, rng), Vector<T>::Zero(d)) {}

  Matrix<T> forward(const Matrix<T>& x, Workspace& ws = default_workspace()) const {
    return down_.forward(up_.forward(x, ws).cwiseMax(T(0)), ws);
  }

  std::vector<nn::Parameter<T>> trainable() {
    std::vector<nn::Parameter<T>> out;
    for (auto& p : up_.trainable()) out.push_back({"up." + p.name, p.value});
    for (auto& p : down_.trainable()) out.push_back({"down." + p.name, p.value});
    return out;
  }

  nn::Gradients<T> backward(const Matrix<T>& x, const Matrix<T>& dy, Workspace& ws = default_workspace()) const {
    const Matrix<T> pre = up_.forward(x, ws);
    nn::Gradients<T> down = down_.backward(pre.cwiseMax(T(0)), dy, ws);
    const Matrix<T> d_pre = (pre.array() > T(0)).select(down.input, T(0));
    nn::Gradients<T> up = up_.backward(x, d_pre, ws);
    nn::Gradients<T> g;
    g.input = std::move(up.input);
    for (auto& p : up.parameters) g.parameters.push_back(std::move(p));
    for (auto& p : down.parameters) g.parameters.push_back(std::move(p));
    return g;
  }

private:
  nn::DenseLinear<T> up_, down_;
};

/// Mean cross-entropy of the rows' logits against their targets, and ∂logits.
template <typename T>
double cross_entropy(const Matrix<T>& logits, const std::vector<int>& targets, Matrix<T>* d_logits) {
  const Index N = logits.rows(), V = logits.cols();
  if (Index(targets.size()) != N)
    throw ShapeError(bd::detail::message("cross_entropy: ", targets.size(), " targets for ", N, " rows"));
  double total = 0;
  if (d_logits) d_logits->resize(N, V);
  for (Index i = 0; i < N; ++i) {
    const int t = targets[std::size_t(i)];
    if (t < 0 || t >= V) throw RangeError(bd::detail::message("cross_entropy: target ", t, " outside ", V, " classes"));
    const double top = double(logits.row(i).maxCoeff());
    double sum = 0;
    for (Index k = 0; k < V; ++k) sum += std::exp(double(logits(i, k)) - top);
    total += std::log(sum) + top - double(logits(i, t));
    if (d_logits) {
      for (Index k = 0; k < V; ++k) (*d_logits)(i, k) = T(std::exp(double(logits(i, k)) - top) / sum / double(N));
      (*d_logits)(i, t) -= T(1.0 / double(N));
    }
  }
  return total / double(N);
}

}  // namespace bd::train
