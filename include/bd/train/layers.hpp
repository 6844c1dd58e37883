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
    // PE depends on the position alone: one length × d table per call, added to every sequence.
    Matrix<T> positions(length, d);
    for (Index k = 0; k < d; ++k) {
      const double rate = std::pow(10000.0, double(k - k % 2) / double(d));
      for (Index p = 0; p < length; ++p) {
        const double angle = double(p) / rate;
        positions(p, k) = T(k % 2 ? std::cos(angle) : std::sin(angle));
      }
    }
    for (const int token : tokens)
      if (token < 0 || token >= vocab())
        throw RangeError(bd::detail::message("Embedding: token ", token, " outside the vocabulary of ", vocab()));
    Matrix<T> x(Index(tokens.size()), d);
    const T scale = T(std::sqrt(double(d)));
    for (Index k = 0; k < d; ++k)  // column by column: both x and the table are column-major
      for (std::size_t i = 0; i < tokens.size(); ++i) x(Index(i), k) = table_(tokens[i], k) * scale + positions(Index(i) % length, k);
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
    const Vector<T> r = rms(x);
    Matrix<T> y(x.rows(), x.cols());
    for (Index k = 0; k < x.cols(); ++k) y.col(k).array() = x.col(k).array() * gain_(k) / r.array();
    return y;
  }

  std::vector<nn::Parameter<T>> trainable() { return {nn::detail::parameter("gain", gain_)}; }

  /// ∂x and {∂gain}.
  nn::Gradients<T> backward(const Matrix<T>& x, const Matrix<T>& dy) const {
    const Vector<T> r = rms(x);
    const Index n = x.rows(), d = x.cols();
    Vector<T> dot = Vector<T>::Zero(n);  // ⟨g ⊙ ∂y, x⟩ per row, summed over channels in order
    for (Index k = 0; k < d; ++k) dot.array() += dy.col(k).array() * gain_(k) * x.col(k).array();
    const Vector<T> c = (dot.array() / (T(d) * r.array() * r.array() * r.array())).matrix();
    nn::Gradients<T> g;
    g.input.resize(n, d);
    Vector<T> d_gain(d);
    for (Index k = 0; k < d; ++k) {
      g.input.col(k).array() = dy.col(k).array() * gain_(k) / r.array() - x.col(k).array() * c.array();
      T sum = 0;
      for (Index i = 0; i < n; ++i) sum += dy(i, k) * x(i, k) / r(i);
      d_gain(k) = sum;
    }
    g.parameters.push_back(d_gain);
    return g;
  }

private:
  /// r per row, √(mean(x²) + ε), the squares summed over channels in order. Column by column:
  /// the matrix is column-major, so a row's channels lie a column apart.
  Vector<T> rms(const Matrix<T>& x) const {
    Vector<T> sum = Vector<T>::Zero(x.rows());
    for (Index k = 0; k < x.cols(); ++k) sum.array() += x.col(k).array().square();
    Vector<T> r(x.rows());
    for (Index i = 0; i < x.rows(); ++i) r(i) = T(std::sqrt(double(sum(i)) / double(x.cols()) + eps_));
    return r;
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
