// bd/nn/metrics.hpp — how a language model's outputs are compared.
#pragma once

#include <cmath>
#include <vector>

#include <Eigen/Core>

#include "bd/base/error.hpp"

namespace bd::nn {

/// exp(mean negative log-likelihood of token i+1 given logits row i), computed in double.
template <typename Derived>
double perplexity(const Eigen::MatrixBase<Derived>& logits, const std::vector<int>& tokens) {
  if (logits.rows() != static_cast<Eigen::Index>(tokens.size()) || tokens.size() < 2)
    throw ShapeError(bd::detail::message("perplexity: ", logits.rows(), " logit rows for ", tokens.size(),
                                         " tokens, expected one row per token and at least two tokens"));
  double nll = 0;
  for (std::size_t i = 0; i + 1 < tokens.size(); ++i) {
    const Eigen::VectorXd row = logits.row(static_cast<Eigen::Index>(i)).transpose().template cast<double>();
    const double top = row.maxCoeff();
    nll += top + std::log((row.array() - top).exp().sum()) - row(tokens[i + 1]);
  }
  return std::exp(nll / double(tokens.size() - 1));
}

/// ‖L − L_exact‖_F / ‖L_exact − rowmean(L_exact)‖_F: the error relative to the logits' spread
/// (a constant shift of a row changes no probability, so it is taken out of the scale).
template <typename DA, typename DB>
double logit_relative_error(const Eigen::MatrixBase<DA>& logits, const Eigen::MatrixBase<DB>& exact) {
  const Eigen::MatrixXd e = exact.template cast<double>();
  const Eigen::VectorXd mean = e.rowwise().mean();
  return (logits.template cast<double>() - e).norm() / (e.colwise() - mean).norm();
}

}  // namespace bd::nn
