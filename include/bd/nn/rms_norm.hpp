// bd/nn/rms_norm.hpp — RMSNorm (Zhang & Sennrich, 2019), the LLaMA family's and MLA's norm.
#pragma once

#include <cmath>

#include <Eigen/Core>

#include "bd/nn/types.hpp"

namespace bd::nn {

/// RMSNorm over each row: x·g / sqrt(mean(x²) + eps) (the square root and reciprocal in double).
template <typename A, typename Gain>
MatrixA<A> rms_norm(const Eigen::Ref<const MatrixA<A>>& x, const Gain& gain, double eps) {
  MatrixA<A> out(x.rows(), x.cols());
  for (Index i = 0; i < x.rows(); ++i) {
    const A inv = A(1.0 / std::sqrt(double(x.row(i).squaredNorm()) / double(x.cols()) + eps));
    out.row(i) = (x.row(i).array() * inv * gain.transpose().array()).matrix();
  }
  return out;
}

}  // namespace bd::nn
